"""A catalogue of named GPUs: memory, bandwidth, tensor throughput and host link, from vendor
specifications, so a plan (and its speed) can be made for a real card (``--gpu "RTX 3090"``)
and a detected card's name picks its figures.

Figures per entry (all dense, no sparsity; the vendor's boost-clock peak):

- ``vram_bytes``: memory capacity (a "24 GB" card holds 24 GiB, as NVML reports it).
- ``mem_bandwidth_bytes_s``: memory bandwidth = data rate per pin x bus width / 8 (the figure on
  the product page or datasheet).
- ``fp16_tensor_flop_s``: FP16 tensor-core FLOP/s with FP16 accumulate, the rate of llama.cpp's
  cuBLAS path for F16/BF16 weights (ggml/src/ggml-cuda/ggml-cuda.cu ``ggml_cuda_op_mul_mat_cublas``
  asks for ``CUBLAS_COMPUTE_16F`` on NVIDIA cards from Volta on); for cards without tensor cores
  (Pascal) the plain FP16 rate.
- ``int8_op_s``: INT8 tensor-core ops/s (Turing and newer: llama.cpp's MMQ kernels use ``mma``
  int8 instructions for quantized weights, ggml-cuda/mmq.cuh ``ggml_cuda_should_use_mmq``); on
  Pascal the DP4A rate (``dp4a`` in ggml-cuda/vecdotq.cuh).
- ``fp32_flop_s``: FP32 shader FLOP/s.
- ``pcie_gen``, ``pcie_lanes``: the card's host link (PCI-SIG lane rates in
  :func:`pcie_bandwidth_bytes_s`).

Tensor rates of GeForce/RTX cards are the architecture whitepapers' per-SM rates times SMs times
boost clock (NVIDIA Ampere GA102 whitepaper appendix A, Ada Lovelace whitepaper appendix A,
Blackwell RTX whitepaper appendix A, Turing whitepaper appendix A); data-centre cards are their
datasheets' dense figures. Each entry names its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..units import GiB

#: PCIe per-lane throughput after encoding, bytes/s, by generation (PCI-SIG: 2.5/5 GT/s with
#: 8b/10b; 8, 16, 32 GT/s with 128b/130b; 64 GT/s PAM4 FLIT).
PCIE_LANE_BYTES_S: dict[int, float] = {1: 250e6, 2: 500e6, 3: 984.6e6, 4: 1969.2e6, 5: 3938.5e6, 6: 7563e6}


def pcie_bandwidth_bytes_s(gen: int, lanes: int) -> float:
    """One-direction PCIe bandwidth in bytes/s of a ``gen`` x ``lanes`` link (:data:`PCIE_LANE_BYTES_S`).

    Raises:
        ValueError: an unknown generation or a lane count below 1.
    """
    if gen not in PCIE_LANE_BYTES_S or lanes < 1:
        raise ValueError(f"PCIe {gen}.0 x{lanes} is not a PCIe link")
    return PCIE_LANE_BYTES_S[gen] * lanes


@dataclass(frozen=True)
class GpuModel:
    """One catalogue entry (units in the module docstring).

    ``name``: the catalogue's name (``"RTX 3090"``); ``nvml_names``: the names NVML reports for it
    (``nvmlDeviceGetName``); ``arch``: ``pascal``, ``turing``, ``turing-gtx`` (the GTX 16 series:
    Turing SMs without tensor cores), ``ampere``, ``ada``, ``hopper`` or ``blackwell``; ``source``:
    where the figures come from.
    """

    name: str
    vram_bytes: int
    mem_bandwidth_bytes_s: float
    fp16_tensor_flop_s: float
    int8_op_s: float
    fp32_flop_s: float
    pcie_gen: int
    pcie_lanes: int
    arch: str
    source: str
    nvml_names: tuple[str, ...] = ()

    @property
    def pcie_bandwidth_bytes_s(self) -> float:
        """Host link bandwidth, bytes/s, one direction; for a unified-memory chip (no link: host
        and GPU share one memory) its memory bandwidth."""
        if self.unified:
            return self.mem_bandwidth_bytes_s
        return pcie_bandwidth_bytes_s(self.pcie_gen, self.pcie_lanes)

    @property
    def vendor(self) -> str:
        """``"NVIDIA"``, ``"AMD"``, ``"Intel"`` or ``"Apple"`` (from :attr:`arch`)."""
        return _VENDOR_OF_ARCH.get(self.arch, "NVIDIA")

    @property
    def unified(self) -> bool:
        """One memory pool shared with the CPU (Apple M-series, AMD Strix Halo): ``vram_bytes`` is
        the machine's RAM, of which the GPU may use a part (:mod:`kvtuner.core.hardware.vendors`)."""
        return self.arch in UNIFIED_ARCHS

    @property
    def has_int8_tensor_cores(self) -> bool:
        """NVIDIA Turing and newer with tensor cores: MMQ runs on int8 ``mma`` tensor-core
        instructions (not Pascal, not the GTX 16 series)."""
        return self.vendor == "NVIDIA" and self.arch not in ("pascal", "turing-gtx")

    def describe(self) -> str:
        """One line: ``RTX 3090: 24 GiB, 936 GB/s, FP16 tensor 142 TFLOPS, INT8 285 TOPS, PCIe 4.0 x16``."""
        return (
            f"{self.name}: {self.vram_bytes / GiB:g} GiB, {self.mem_bandwidth_bytes_s / 1e9:.0f} GB/s, "
            f"FP16 tensor {self.fp16_tensor_flop_s / 1e12:.0f} TFLOPS, INT8 {self.int8_op_s / 1e12:.0f} TOPS, "
            f"FP32 {self.fp32_flop_s / 1e12:.1f} TFLOPS, PCIe {self.pcie_gen}.0 x{self.pcie_lanes}"
        )


#: Architectures of the other vendors' entries.
_VENDOR_OF_ARCH = {
    "rdna3": "AMD",
    "rdna3.5": "AMD",
    "rdna4": "AMD",
    "xe-hpg": "Intel",
    "xe2": "Intel",
    "apple-m1": "Apple",
    "apple-m2": "Apple",
    "apple-m3": "Apple",
    "apple-m4": "Apple",
}
#: Architectures whose entries are unified-memory chips (memory shared with the CPU).
UNIFIED_ARCHS = frozenset({"rdna3.5", "apple-m1", "apple-m2", "apple-m3", "apple-m4"})

_AMPERE = "NVIDIA Ampere GA102 GPU architecture whitepaper v2, appendix A (https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf)"
_ADA = "NVIDIA Ada GPU architecture whitepaper v2.1, appendix A (https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf)"
_BLACKWELL = "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix A (https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf)"
_TURING = "NVIDIA Turing GPU architecture whitepaper, appendix A (https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf)"


def _tensor(sms_tcs: int, boost_ghz: float, flop_per_clk: int) -> float:
    """Tensor FLOP/s = tensor cores x boost clock x dense FLOP per clock per tensor core."""
    return sms_tcs * boost_ghz * 1e9 * flop_per_clk


#: Per streaming multiprocessor, by architecture: tensor cores, FP32 lanes, dense FP16 FLOP per clock
#: per tensor core (FP16 accumulate); INT8 ops are twice the FP16 rate (the whitepapers' tables).
_SM_FIGURES: dict[str, tuple[int, int, int]] = {
    "turing": (8, 64, 128),
    "ampere": (4, 128, 256),
    "ada": (4, 128, 256),
    "blackwell": (4, 128, 256),
}
_ARCH_SOURCE = {"turing": _TURING, "ampere": _AMPERE, "ada": _ADA, "blackwell": _BLACKWELL}
_SPEC_PAGES = {
    "turing": "NVIDIA GeForce RTX 20 series specifications (https://www.nvidia.com/en-us/geforce/graphics-cards/rtx-2080/, "
    "https://www.nvidia.com/en-us/geforce/gaming-laptops/20-series/)",
    "ampere": "NVIDIA GeForce RTX 30 series specifications (https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/, "
    "https://www.nvidia.com/en-us/geforce/laptops/30-series/)",
    "ada": "NVIDIA GeForce RTX 40 series specifications (https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/, "
    "https://www.nvidia.com/en-us/geforce/laptops/40-series/)",
    "blackwell": "NVIDIA GeForce RTX 50 series specifications (https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/, "
    "https://www.nvidia.com/en-us/geforce/laptops/50-series/)",
}


def _geforce(
    name: str, vram_gib: int, gbps: float, bus_bits: int, sms: int, boost_mhz: int, pcie: tuple[int, int], arch: str
) -> GpuModel:
    """A GeForce card from its product-page figures: memory (GiB), data rate per pin (Gbps) and bus
    width (bits), streaming multiprocessors, boost clock (MHz; a laptop part's is the top of
    NVIDIA's range, its highest-power configuration) and PCIe link; tensor and FP32 rates are
    SMs x per-SM figures (:data:`_SM_FIGURES`) x boost clock. NVML reports it as
    ``NVIDIA GeForce <name>``, a laptop part as ``NVIDIA GeForce RTX 4060 Laptop GPU``."""
    tcs_per_sm, lanes_per_sm, fp16_per_tc = _SM_FIGURES[arch]
    ghz = boost_mhz / 1000
    base = re.sub(r" \d+GB$", "", name)
    nvml = f"NVIDIA GeForce {base} GPU" if base.endswith("Laptop") else f"NVIDIA GeForce {base}"
    return GpuModel(
        name,
        vram_gib * GiB,
        gbps * bus_bits / 8 * 1e9,
        _tensor(sms * tcs_per_sm, ghz, fp16_per_tc),
        _tensor(sms * tcs_per_sm, ghz, 2 * fp16_per_tc),
        sms * lanes_per_sm * 2 * ghz * 1e9,
        pcie[0],
        pcie[1],
        arch,
        f"{_SPEC_PAGES[arch]}; {_ARCH_SOURCE[arch].split(' (')[0]}: {sms} SMs, {boost_mhz} MHz boost, "
        f"{gbps:g} Gbps x {bus_bits}-bit, PCIe {pcie[0]}.0 x{pcie[1]}",
        (nvml,),
    )


_G3X16, _G4X16, _G4X8, _G5X16, _G5X8 = (3, 16), (4, 16), (4, 8), (5, 16), (5, 8)
#: GeForce RTX 20 series (Turing), desktop and laptop.
_GEFORCE_20 = (
    _geforce("RTX 2060", 6, 14, 192, 30, 1680, _G3X16, "turing"),
    _geforce("RTX 2060 12GB", 12, 14, 192, 34, 1650, _G3X16, "turing"),
    _geforce("RTX 2060 Super", 8, 14, 256, 34, 1650, _G3X16, "turing"),
    _geforce("RTX 2070", 8, 14, 256, 36, 1620, _G3X16, "turing"),
    _geforce("RTX 2070 Super", 8, 14, 256, 40, 1770, _G3X16, "turing"),
    _geforce("RTX 2080", 8, 14, 256, 46, 1710, _G3X16, "turing"),
    _geforce("RTX 2080 Super", 8, 15.5, 256, 48, 1815, _G3X16, "turing"),
    _geforce("RTX 2060 Laptop", 6, 14, 192, 30, 1200, _G3X16, "turing"),
    _geforce("RTX 2070 Laptop", 8, 14, 256, 36, 1455, _G3X16, "turing"),
    _geforce("RTX 2070 Super Laptop", 8, 14, 256, 40, 1380, _G3X16, "turing"),
    _geforce("RTX 2080 Laptop", 8, 14, 256, 46, 1590, _G3X16, "turing"),
    _geforce("RTX 2080 Super Laptop", 8, 14, 256, 48, 1560, _G3X16, "turing"),
)
#: GeForce RTX 30 series (Ampere) not listed in the catalogue's own entries, desktop and laptop.
_GEFORCE_30 = (
    _geforce("RTX 3050 6GB", 6, 14, 96, 18, 1470, _G4X8, "ampere"),
    _geforce("RTX 3050 8GB", 8, 14, 128, 20, 1777, _G4X8, "ampere"),
    _geforce("RTX 3060 8GB", 8, 15, 128, 28, 1777, _G4X16, "ampere"),
    _geforce("RTX 3060 Ti", 8, 14, 256, 38, 1665, _G4X16, "ampere"),
    _geforce("RTX 3070 Ti", 8, 19, 256, 48, 1770, _G4X16, "ampere"),
    _geforce("RTX 3080 12GB", 12, 19, 384, 70, 1710, _G4X16, "ampere"),
    _geforce("RTX 3050 Laptop", 4, 12, 128, 16, 1740, _G4X8, "ampere"),
    _geforce("RTX 3050 Ti Laptop", 4, 12, 128, 20, 1695, _G4X8, "ampere"),
    _geforce("RTX 3060 Laptop", 6, 14, 192, 30, 1703, _G4X16, "ampere"),
    _geforce("RTX 3070 Laptop", 8, 14, 256, 40, 1620, _G4X16, "ampere"),
    _geforce("RTX 3070 Ti Laptop", 8, 14, 256, 46, 1485, _G4X16, "ampere"),
    _geforce("RTX 3080 Laptop 8GB", 8, 14, 256, 48, 1710, _G4X16, "ampere"),
    _geforce("RTX 3080 Laptop 16GB", 16, 14, 256, 48, 1710, _G4X16, "ampere"),
    _geforce("RTX 3080 Ti Laptop", 16, 16, 256, 58, 1590, _G4X16, "ampere"),
)
#: GeForce RTX 40 series (Ada) not listed in the catalogue's own entries, desktop and laptop.
_GEFORCE_40 = (
    _geforce("RTX 4070", 12, 21, 192, 46, 2475, _G4X16, "ada"),
    _geforce("RTX 4070 Super", 12, 21, 192, 56, 2475, _G4X16, "ada"),
    _geforce("RTX 4070 Ti Super", 16, 21, 256, 66, 2610, _G4X16, "ada"),
    _geforce("RTX 4080 Super", 16, 23, 256, 80, 2550, _G4X16, "ada"),
    _geforce("RTX 4050 Laptop", 6, 16, 96, 20, 2370, _G4X8, "ada"),
    _geforce("RTX 4060 Laptop", 8, 16, 128, 24, 2370, _G4X8, "ada"),
    _geforce("RTX 4070 Laptop", 8, 16, 128, 36, 2175, _G4X8, "ada"),
    _geforce("RTX 4080 Laptop", 12, 18, 192, 58, 2280, _G4X16, "ada"),
    _geforce("RTX 4090 Laptop", 16, 18, 256, 76, 2040, _G4X16, "ada"),
)
#: GeForce RTX 50 series (Blackwell) not listed in the catalogue's own entries, desktop and laptop.
_GEFORCE_50 = (
    _geforce("RTX 5050", 8, 20, 128, 20, 2572, _G5X8, "blackwell"),
    _geforce("RTX 5060", 8, 28, 128, 30, 2497, _G5X8, "blackwell"),
    _geforce("RTX 5060 Ti 8GB", 8, 28, 128, 36, 2572, _G5X8, "blackwell"),
    _geforce("RTX 5060 Ti 16GB", 16, 28, 128, 36, 2572, _G5X8, "blackwell"),
    _geforce("RTX 5070", 12, 28, 192, 48, 2512, _G5X16, "blackwell"),
    _geforce("RTX 5070 Ti", 16, 28, 256, 70, 2452, _G5X16, "blackwell"),
    _geforce("RTX 5080", 16, 30, 256, 84, 2617, _G5X16, "blackwell"),
    _geforce("RTX 5050 Laptop", 8, 24, 128, 20, 2500, _G5X8, "blackwell"),
    _geforce("RTX 5060 Laptop", 8, 24, 128, 26, 2497, _G5X8, "blackwell"),
    _geforce("RTX 5070 Laptop", 8, 24, 128, 36, 2347, _G5X8, "blackwell"),
    _geforce("RTX 5070 Ti Laptop", 12, 28, 192, 46, 2220, _G5X16, "blackwell"),
    _geforce("RTX 5080 Laptop", 16, 28, 256, 60, 2287, _G5X16, "blackwell"),
    _geforce("RTX 5090 Laptop", 24, 28, 256, 82, 2160, _G5X16, "blackwell"),
)

_WORKSTATION_PAGES = {
    "ampere": "https://www.nvidia.com/en-us/design-visualization/desktop-graphics/",
    "ada": "https://www.nvidia.com/en-us/design-visualization/desktop-graphics/",
    "blackwell": "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/",
}


def _workstation(
    name: str,
    vram_gib: int,
    gbps: float,
    bus_bits: int,
    sms: int,
    boost_mhz: int,
    pcie: tuple[int, int],
    arch: str,
    nvml: str,
    clock_source: str = "",
) -> GpuModel:
    """An NVIDIA RTX professional (workstation) board, built as :func:`_geforce` builds a GeForce
    card: memory from its data rate and bus width, tensor and FP32 rates from SMs x per-SM
    figures x boost clock. NVIDIA's datasheets give memory, bandwidth, CUDA cores and PCIe but no
    clock; the boost clock is TechPowerUp GPU database's (https://www.techpowerup.com/gpu-specs/),
    and the result matches the datasheets' tensor figures (RTX A1000: 18 SMs x 4 x 256 x
    1.46 GHz = 26.9 dense FP16 TFLOPS, 53.8 with sparsity). ``clock_source``: where the clock
    comes from instead, when TechPowerUp's disagrees with NVIDIA's own FP32 figure or has none."""
    card = _geforce(name, vram_gib, gbps, bus_bits, sms, boost_mhz, pcie, arch)
    board = f"{gbps:g} Gbps x {bus_bits}-bit, PCIe {pcie[0]}.0 x{pcie[1]}"
    source = f"NVIDIA RTX professional GPUs ({_WORKSTATION_PAGES[arch]}); TechPowerUp GPU database: {sms} SMs, "
    if clock_source:
        source += f"{board}; {boost_mhz} MHz boost: {clock_source}"
    else:
        source += f"{boost_mhz} MHz boost, {board}"
    return replace(card, source=source, nvml_names=(nvml,))


def _pro6000(name: str, boost_mhz: int, nvml: str, clock_source: str = "") -> GpuModel:
    """One of the three RTX PRO 6000 Blackwell boards (Workstation, Server, Max-Q Workstation
    Edition): NVIDIA gives them the same 188 SMs and 96 GB at 28 Gbps on 512 bits, PCIe 5.0 x16;
    they differ in clock (power limit)."""
    return _workstation(name, 96, 28, 512, 188, boost_mhz, _G5X16, "blackwell", nvml, clock_source)


#: NVIDIA RTX professional desktop boards (Ampere RTX A, RTX Ada Generation, RTX PRO Blackwell).
_WORKSTATION = (
    _workstation("RTX A400", 4, 12, 64, 6, 1762, _G4X8, "ampere", "NVIDIA RTX A400"),
    _workstation("RTX A1000", 8, 12, 128, 18, 1460, _G4X8, "ampere", "NVIDIA RTX A1000"),
    _workstation("RTX A2000", 6, 12, 192, 26, 1200, _G4X16, "ampere", "NVIDIA RTX A2000"),
    _workstation("RTX A2000 12GB", 12, 12, 192, 26, 1200, _G4X16, "ampere", "NVIDIA RTX A2000 12GB"),
    _workstation("RTX A4000", 16, 14, 256, 48, 1560, _G4X16, "ampere", "NVIDIA RTX A4000"),
    _workstation("RTX A4500", 20, 16, 320, 56, 1650, _G4X16, "ampere", "NVIDIA RTX A4500"),
    _workstation("RTX A5000", 24, 16, 384, 64, 1695, _G4X16, "ampere", "NVIDIA RTX A5000"),
    _workstation("RTX A5500", 24, 16, 384, 80, 1665, _G4X16, "ampere", "NVIDIA RTX A5500"),
    _workstation("RTX 2000 Ada", 16, 14, 128, 22, 2130, _G4X8, "ada", "NVIDIA RTX 2000 Ada Generation"),
    _workstation("RTX 4000 SFF Ada", 20, 14, 160, 48, 1560, _G4X16, "ada", "NVIDIA RTX 4000 SFF Ada Generation"),
    _workstation("RTX 4000 Ada", 20, 18, 160, 48, 2175, _G4X16, "ada", "NVIDIA RTX 4000 Ada Generation"),
    _workstation("RTX 4500 Ada", 24, 18, 192, 60, 2580, _G4X16, "ada", "NVIDIA RTX 4500 Ada Generation"),
    _workstation("RTX 5000 Ada", 32, 18, 256, 100, 2550, _G4X16, "ada", "NVIDIA RTX 5000 Ada Generation"),
    _workstation("RTX 6000 Ada", 48, 20, 384, 142, 2505, _G4X16, "ada", "NVIDIA RTX 6000 Ada Generation"),
    _workstation("RTX PRO 4000 Blackwell", 24, 28, 192, 70, 2617, _G5X16, "blackwell", "NVIDIA RTX PRO 4000 Blackwell"),
    _workstation("RTX PRO 4500 Blackwell", 32, 28, 256, 82, 2617, _G5X16, "blackwell", "NVIDIA RTX PRO 4500 Blackwell"),
    _workstation(
        "RTX PRO 5000 Blackwell",
        48,
        28,
        384,
        110,
        2308,
        _G5X16,
        "blackwell",
        "NVIDIA RTX PRO 5000 Blackwell",
        "NVIDIA's 65 TFLOPS FP32 / (14,080 CUDA cores x 2 FLOP); TechPowerUp's 2617 MHz would give 73.7",
    ),
    _pro6000("RTX PRO 6000 Blackwell", 2617, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"),
    _pro6000(
        "RTX PRO 6000 Blackwell Server Edition",
        2617,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "the Workstation Edition's: NVIDIA publishes no clock for any of the three boards",
    ),
    _pro6000("RTX PRO 6000 Blackwell Max-Q", 2288, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"),
)

# Dense FP16 (FP16 accumulate) FLOP per clock per tensor core: Turing 128, Ampere GA10x 256,
# Ada 256, Blackwell GB20x 256; INT8 ops twice that (the whitepapers' tables).
_CATALOGUE: tuple[GpuModel, ...] = (
    GpuModel(
        "Tesla P40",
        24 * GiB,
        346e9,
        0.183e12,
        47.0e12,
        11.76e12,
        3,
        16,
        "pascal",
        "NVIDIA Tesla P40 datasheet (https://images.nvidia.com/content/pdf/tesla/184427-Tesla-P40-Datasheet-NV-Final-Letter-Web.pdf): "
        "346 GB/s, 11.76 TFLOPS FP32, 47 TOPS INT8; FP16 1/64 of FP32 on GP102",
        ("Tesla P40",),
    ),
    GpuModel(
        "GTX 1660 Ti",
        6 * GiB,
        288e9,
        10.87e12,
        21.7e12,
        5.437e12,
        3,
        16,
        "turing-gtx",
        "NVIDIA GeForce GTX 1660 Ti specifications (https://www.nvidia.com/en-us/geforce/graphics-cards/gtx-1660-ti/): "
        "TU116, 1536 CUDA cores, 1770 MHz boost, 12 Gbps x 192-bit GDDR6 (288 GB/s), PCIe 3.0 x16; no tensor cores: "
        "FP32 1536 x 2 x 1.77 GHz = 5.44 TFLOPS, FP16 twice that (Turing whitepaper: TU116's dedicated FP16 units), "
        "INT8 by DP4A 4 x FP32",
        ("NVIDIA GeForce GTX 1660 Ti",),
    ),
    GpuModel(
        "Tesla T4",
        16 * GiB,
        320e9,
        65e12,
        130e12,
        8.1e12,
        3,
        16,
        "turing",
        "NVIDIA T4 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf)",
        ("Tesla T4",),
    ),
    GpuModel(
        "RTX 2080 Ti",
        11 * GiB,
        616e9,
        _tensor(544, 1.545, 128),
        _tensor(544, 1.545, 256),
        13.45e12,
        3,
        16,
        "turing",
        _TURING + ": 544 tensor cores, 1545 MHz boost, 14 Gbps x 352-bit",
        ("NVIDIA GeForce RTX 2080 Ti",),
    ),
    *_GEFORCE_20,
    *_GEFORCE_30,
    *_GEFORCE_40,
    *_GEFORCE_50,
    *_WORKSTATION,
    GpuModel(
        "RTX 3060 12GB",
        12 * GiB,
        360e9,
        _tensor(112, 1.777, 256),
        _tensor(112, 1.777, 512),
        12.74e12,
        4,
        16,
        "ampere",
        _AMPERE + "; RTX 3060 product page: 112 tensor cores, 1777 MHz boost, 15 Gbps x 192-bit",
        ("NVIDIA GeForce RTX 3060",),
    ),
    GpuModel(
        "RTX 3070",
        8 * GiB,
        448e9,
        _tensor(184, 1.725, 256),
        _tensor(184, 1.725, 512),
        20.31e12,
        4,
        16,
        "ampere",
        _AMPERE + ": 184 tensor cores, 1725 MHz boost, 14 Gbps x 256-bit",
        ("NVIDIA GeForce RTX 3070",),
    ),
    GpuModel(
        "RTX 3080 10GB",
        10 * GiB,
        760e9,
        _tensor(272, 1.71, 256),
        _tensor(272, 1.71, 512),
        29.77e12,
        4,
        16,
        "ampere",
        _AMPERE + ": 272 tensor cores, 1710 MHz boost, 19 Gbps x 320-bit",
        ("NVIDIA GeForce RTX 3080",),
    ),
    GpuModel(
        "RTX 3080 Ti",
        12 * GiB,
        912e9,
        _tensor(320, 1.665, 256),
        _tensor(320, 1.665, 512),
        34.1e12,
        4,
        16,
        "ampere",
        _AMPERE + "; RTX 3080 Ti product page: 320 tensor cores, 1665 MHz boost, 19 Gbps x 384-bit",
        ("NVIDIA GeForce RTX 3080 Ti",),
    ),
    GpuModel(
        "RTX 3090",
        24 * GiB,
        936.2e9,
        _tensor(328, 1.695, 256),
        _tensor(328, 1.695, 512),
        35.58e12,
        4,
        16,
        "ampere",
        _AMPERE + ": 328 tensor cores, 1695 MHz boost, 19.5 Gbps x 384-bit",
        ("NVIDIA GeForce RTX 3090",),
    ),
    GpuModel(
        "RTX 3090 Ti",
        24 * GiB,
        1008e9,
        _tensor(336, 1.86, 256),
        _tensor(336, 1.86, 512),
        40.0e12,
        4,
        16,
        "ampere",
        _AMPERE + "; RTX 3090 Ti product page: 336 tensor cores, 1860 MHz boost, 21 Gbps x 384-bit",
        ("NVIDIA GeForce RTX 3090 Ti",),
    ),
    GpuModel(
        "RTX A6000",
        48 * GiB,
        768e9,
        154.8e12,
        309.7e12,
        38.7e12,
        4,
        16,
        "ampere",
        "NVIDIA RTX A6000 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf): "
        "768 GB/s, 38.7 TFLOPS FP32, 309.7 TFLOPS tensor with sparsity (dense half)",
        ("NVIDIA RTX A6000",),
    ),
    GpuModel(
        "A100 40GB",
        40 * GiB,
        1555e9,
        312e12,
        624e12,
        19.5e12,
        4,
        16,
        "ampere",
        "NVIDIA A100 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)",
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    ),
    GpuModel(
        "A100 80GB",
        80 * GiB,
        2039e9,
        312e12,
        624e12,
        19.5e12,
        4,
        16,
        "ampere",
        "NVIDIA A100 datasheet (SXM4 80GB: 2039 GB/s HBM2e, 312 TFLOPS FP16 tensor, 624 TOPS INT8)",
        ("NVIDIA A100-SXM4-80GB",),
    ),
    GpuModel(
        "A100 80GB PCIe",
        80 * GiB,
        1935e9,
        312e12,
        624e12,
        19.5e12,
        4,
        16,
        "ampere",
        "NVIDIA A100 datasheet (PCIe 80GB: 1935 GB/s HBM2e)",
        ("NVIDIA A100 80GB PCIe",),
    ),
    GpuModel(
        "RTX 4060",
        8 * GiB,
        272e9,
        _tensor(96, 2.46, 256),
        _tensor(96, 2.46, 512),
        15.11e12,
        4,
        8,
        "ada",
        _ADA + "; RTX 4060 product page: 96 tensor cores, 2460 MHz boost, 17 Gbps x 128-bit, PCIe 4.0 x8",
        ("NVIDIA GeForce RTX 4060",),
    ),
    GpuModel(
        "RTX 4060 Ti 8GB",
        8 * GiB,
        288e9,
        _tensor(136, 2.535, 256),
        _tensor(136, 2.535, 512),
        22.06e12,
        4,
        8,
        "ada",
        _ADA + "; RTX 4060 Ti product page: 136 tensor cores, 2535 MHz boost, 18 Gbps x 128-bit, PCIe 4.0 x8",
        ("NVIDIA GeForce RTX 4060 Ti",),
    ),
    GpuModel(
        "RTX 4060 Ti 16GB",
        16 * GiB,
        288e9,
        _tensor(136, 2.535, 256),
        _tensor(136, 2.535, 512),
        22.06e12,
        4,
        8,
        "ada",
        _ADA + "; RTX 4060 Ti product page: 136 tensor cores, 2535 MHz boost, 18 Gbps x 128-bit, PCIe 4.0 x8",
        ("NVIDIA GeForce RTX 4060 Ti",),
    ),
    GpuModel(
        "RTX 4070 Ti",
        12 * GiB,
        504e9,
        _tensor(240, 2.61, 256),
        _tensor(240, 2.61, 512),
        40.09e12,
        4,
        16,
        "ada",
        _ADA + "; RTX 4070 Ti product page: 240 tensor cores, 2610 MHz boost, 21 Gbps x 192-bit",
        ("NVIDIA GeForce RTX 4070 Ti",),
    ),
    GpuModel(
        "RTX 4080",
        16 * GiB,
        716.8e9,
        _tensor(304, 2.505, 256),
        _tensor(304, 2.505, 512),
        48.74e12,
        4,
        16,
        "ada",
        _ADA + ": 304 tensor cores, 2505 MHz boost, 22.4 Gbps x 256-bit",
        ("NVIDIA GeForce RTX 4080",),
    ),
    GpuModel(
        "RTX 4090",
        24 * GiB,
        1008e9,
        _tensor(512, 2.52, 256),
        _tensor(512, 2.52, 512),
        82.58e12,
        4,
        16,
        "ada",
        _ADA + ": 512 tensor cores, 2520 MHz boost, 21 Gbps x 384-bit",
        ("NVIDIA GeForce RTX 4090",),
    ),
    GpuModel(
        "RTX 5090",
        32 * GiB,
        1792e9,
        _tensor(680, 2.407, 256),
        _tensor(680, 2.407, 512),
        104.8e12,
        5,
        16,
        "blackwell",
        _BLACKWELL + ": 680 tensor cores, 2407 MHz boost, 28 Gbps x 512-bit GDDR7",
        ("NVIDIA GeForce RTX 5090",),
    ),
    GpuModel(
        "H100 PCIe",
        80 * GiB,
        2039e9,
        756.5e12,
        1513e12,
        51.2e12,
        5,
        16,
        "hopper",
        "NVIDIA H100 datasheet (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet): PCIe 80GB, "
        "2 TB/s, 1513 TFLOPS FP16 / 3026 TOPS INT8 with sparsity (dense half)",
        ("NVIDIA H100 PCIe",),
    ),
    GpuModel(
        "H100 SXM",
        80 * GiB,
        3352e9,
        989.4e12,
        1978.9e12,
        66.9e12,
        5,
        16,
        "hopper",
        "NVIDIA H100 datasheet: SXM5 80GB, 3.35 TB/s, 1979 TFLOPS FP16 / 3958 TOPS INT8 with sparsity (dense half)",
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
    ),
    GpuModel(
        "H200",
        141 * GiB,
        4800e9,
        989.4e12,
        1978.9e12,
        66.9e12,
        5,
        16,
        "hopper",
        "NVIDIA H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/): 141 GB HBM3e, 4.8 TB/s, "
        "1979 TFLOPS FP16 / 3958 TOPS INT8 with sparsity (dense half)",
        ("NVIDIA H200", "NVIDIA H200 NVL"),
    ),
)
# AMD, Intel and Apple: no tensor-core path in llama.cpp's rates here, so the FP16 and INT8 figures
# are the vector rates (FP16 = 2 x FP32 packed math; INT8 = the FP16 rate), the conservative figure
# for Vulkan/ROCm/SYCL/Metal kernels that do not use the matrix units.
_AMD = "AMD product specifications (https://www.amd.com/en/products/specifications/graphics.html)"
_INTEL = (
    "Intel Arc product specifications (https://www.intel.com/content/www/us/en/products/details/discrete-gpus/arc.html)"
)
_APPLE = (
    "Apple newsroom / tech specs (memory bandwidth, memory size); FP32 = GPU cores x 128 lanes x 2 x clock "
    "(Apple publishes no clock: public measurements)"
)


def _vec(fp32_tflops: float) -> tuple[float, float, float]:
    """(FP16, INT8, FP32) FLOP/s of a card without a tensor-core path: FP16 = INT8 = 2 x FP32."""
    return 2 * fp32_tflops * 1e12, 2 * fp32_tflops * 1e12, fp32_tflops * 1e12


_OTHER_VENDORS: tuple[GpuModel, ...] = (
    GpuModel(
        "RX 7600",
        8 * GiB,
        288e9,
        *_vec(21.75),
        4,
        8,
        "rdna3",
        _AMD + ": 18 Gbps x 128-bit, 21.75 TFLOPS FP32, PCIe 4.0 x8",
    ),
    GpuModel(
        "RX 7600 XT",
        16 * GiB,
        288e9,
        *_vec(22.57),
        4,
        8,
        "rdna3",
        _AMD + ": 18 Gbps x 128-bit, 22.57 TFLOPS FP32, PCIe 4.0 x8",
    ),
    GpuModel(
        "RX 7700 XT", 12 * GiB, 432e9, *_vec(35.17), 4, 16, "rdna3", _AMD + ": 18 Gbps x 192-bit, 35.17 TFLOPS FP32"
    ),
    GpuModel(
        "RX 7800 XT", 16 * GiB, 624e9, *_vec(37.32), 4, 16, "rdna3", _AMD + ": 19.5 Gbps x 256-bit, 37.32 TFLOPS FP32"
    ),
    GpuModel(
        "RX 7900 GRE", 16 * GiB, 576e9, *_vec(45.98), 4, 16, "rdna3", _AMD + ": 18 Gbps x 256-bit, 45.98 TFLOPS FP32"
    ),
    GpuModel(
        "RX 7900 XT", 20 * GiB, 800e9, *_vec(51.48), 4, 16, "rdna3", _AMD + ": 20 Gbps x 320-bit, 51.48 TFLOPS FP32"
    ),
    GpuModel(
        "RX 7900 XTX",
        24 * GiB,
        960e9,
        *_vec(61.39),
        4,
        16,
        "rdna3",
        _AMD + ": 20 Gbps x 384-bit, 61.39 TFLOPS FP32",
        ("AMD Radeon RX 7900 XTX", "Radeon RX 7900 XTX"),
    ),
    GpuModel(
        "RX 9060 XT 16GB",
        16 * GiB,
        320e9,
        *_vec(25.64),
        5,
        16,
        "rdna4",
        _AMD + ": 20 Gbps x 128-bit, 25.64 TFLOPS FP32, PCIe 5.0 x16",
    ),
    GpuModel(
        "RX 9070",
        16 * GiB,
        640e9,
        *_vec(36.13),
        5,
        16,
        "rdna4",
        _AMD + ": 20 Gbps x 256-bit, 36.13 TFLOPS FP32, PCIe 5.0 x16",
    ),
    GpuModel(
        "RX 9070 XT",
        16 * GiB,
        640e9,
        *_vec(48.66),
        5,
        16,
        "rdna4",
        _AMD + ": 20 Gbps x 256-bit, 48.66 TFLOPS FP32, PCIe 5.0 x16",
    ),
    GpuModel(
        "Strix Halo 128GB",
        128 * GiB,
        256e9,
        *_vec(29.7),
        0,
        0,
        "rdna3.5",
        _AMD + " (Ryzen AI Max+ 395, Radeon 8060S): LPDDR5X-8000 x 256-bit shared with the CPU; 40 CUs x 2.9 GHz",
        ("AMD Radeon 8060S Graphics", "Radeon 8060S Graphics"),
    ),
    GpuModel(
        "Arc A770 16GB",
        16 * GiB,
        560e9,
        *_vec(19.66),
        4,
        16,
        "xe-hpg",
        _INTEL + ": 17.5 Gbps x 256-bit, 32 Xe cores at 2.4 GHz",
        ("Intel(R) Arc(TM) A770 Graphics",),
    ),
    GpuModel(
        "Arc B580",
        12 * GiB,
        456e9,
        *_vec(13.67),
        4,
        8,
        "xe2",
        _INTEL + ": 19 Gbps x 192-bit, 20 Xe2 cores at 2.67 GHz, PCIe 4.0 x8",
        ("Intel(R) Arc(TM) B580 Graphics",),
    ),
    GpuModel(
        "M1 Max 64GB",
        64 * GiB,
        400e9,
        *_vec(10.4),
        0,
        0,
        "apple-m1",
        _APPLE + ": 400 GB/s, 32 GPU cores",
        ("Apple M1 Max",),
    ),
    GpuModel(
        "M2 Max 96GB",
        96 * GiB,
        400e9,
        *_vec(13.6),
        0,
        0,
        "apple-m2",
        _APPLE + ": 400 GB/s, 38 GPU cores",
        ("Apple M2 Max",),
    ),
    GpuModel(
        "M2 Ultra 192GB",
        192 * GiB,
        800e9,
        *_vec(27.2),
        0,
        0,
        "apple-m2",
        _APPLE + ": 800 GB/s, 76 GPU cores",
        ("Apple M2 Ultra",),
    ),
    GpuModel(
        "M3 Max 128GB",
        128 * GiB,
        400e9,
        *_vec(14.1),
        0,
        0,
        "apple-m3",
        _APPLE + ": 400 GB/s (16-core CPU), 40 GPU cores",
        ("Apple M3 Max",),
    ),
    GpuModel(
        "M4 Pro 48GB",
        48 * GiB,
        273e9,
        *_vec(9.2),
        0,
        0,
        "apple-m4",
        _APPLE + ": 273 GB/s, 20 GPU cores",
        ("Apple M4 Pro",),
    ),
    GpuModel(
        "M4 Max 128GB",
        128 * GiB,
        546e9,
        *_vec(16.2),
        0,
        0,
        "apple-m4",
        _APPLE + ": 546 GB/s (16-core CPU), 40 GPU cores",
        ("Apple M4 Max",),
    ),
)

_CATALOGUE = _CATALOGUE + _OTHER_VENDORS

#: The catalogue by name.
GPU_CATALOGUE: dict[str, GpuModel] = {g.name: g for g in _CATALOGUE}


def _words(text: str) -> list[str]:
    """The words of a GPU name: lower case, vendor words (nvidia, geforce, tesla, amd, radeon,
    intel, apple, gpu) dropped, split at every non-alphanumeric (``"NVIDIA RTX PRO 6000"`` ->
    ``["rtx", "pro", "6000"]``)."""
    t = re.sub(r"\b(nvidia|geforce|tesla|amd|radeon|intel|apple|gpu)\b", " ", text.lower())
    return re.findall(r"[a-z0-9]+", t)


def _norm(text: str) -> str:
    """:func:`_words` run together (``"RTX 3090"`` -> ``"rtx3090"``)."""
    return "".join(_words(text))


def _keys(g: GpuModel) -> set[str]:
    """The spellings that name ``g`` exactly: its name, its NVML names (each normalised, :func:`_norm`)
    and the name without its leading ``rtx`` (``"5090"``, ``"2080 Ti"``)."""
    keys = {_norm(g.name), *(_norm(n) for n in g.nvml_names)}
    return keys | {k[3:] for k in keys if k.startswith("rtx") and len(k) > 3}


def nearest_gpu_names(name: str, n: int = 6) -> list[str]:
    """Up to ``n`` catalogue names nearest ``name``: those whose name contains it, then the
    closest spellings (difflib's ratio on normalised names)."""
    import difflib

    key = _norm(name)
    by_norm = {_norm(g.name): g.name for g in _CATALOGUE}
    out = sorted((g.name for g in _CATALOGUE if key and key in _norm(g.name)), key=lambda n: (len(n), n))
    out += [by_norm[k] for k in difflib.get_close_matches(key, list(by_norm), n=n, cutoff=0.5)]
    return list(dict.fromkeys(out))[:n]


class UnknownGpuError(ValueError):
    """A GPU name the catalogue does not know (or that names several entries); the message lists
    the nearest catalogue names."""


def find_gpu(name: str) -> GpuModel:
    """The catalogue entry a user names exactly (``"RTX 3090"``, ``"rtx3090"``, ``"NVIDIA GeForce
    RTX 3090"``, ``"RTX 4060 Laptop GPU"``): case, spaces, dashes, the words NVIDIA, GeForce,
    Tesla and GPU, and a leading RTX do not matter. A name that is the start of another is not
    that other card: ``"RTX 2080"`` is the 8 GB RTX 2080, never the RTX 2080 Ti.

    Raises:
        UnknownGpuError: no entry, or several (cards sold in two memory sizes under one name, such
            as ``"RTX 4060 Ti"``); the message lists the nearest entries.
    """
    key = _norm(name)
    if not key:
        raise UnknownGpuError("empty GPU name: give a card's name, e.g. \"RTX 3060 12GB\" ('kvtuner gpus' lists them)")
    exact = [g for g in _CATALOGUE if _norm(g.name) == key]
    hits = exact or [g for g in _CATALOGUE if key in _keys(g)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise UnknownGpuError(
            f"GPU {name!r} matches several catalogue entries: {', '.join(g.name for g in hits)}; name one of them"
        )
    words = _words(name)
    longer = [g.name for g in _CATALOGUE if words and _words(g.name)[: len(words)] == words]
    if longer:
        raise UnknownGpuError(
            f"GPU {name!r} is not a catalogue name, only the start of {', '.join(longer)}: name yours "
            "exactly (a name that starts another card's is not that card), or give its memory size with --gpu-mem"
        )
    near = nearest_gpu_names(name)
    hint = f"nearest: {', '.join(near)}" if near else "'kvtuner gpus' lists the catalogue"
    raise UnknownGpuError(
        f"GPU {name!r} is not in the catalogue ({hint}); name one exactly, or give its memory size with --gpu-mem"
    )


def match_nvml_name(nvml_name: str, total_bytes: int | None = None) -> GpuModel | None:
    """The entry for a card NVML reports as ``nvml_name`` (exact name match after normalisation);
    when several entries share the name (RTX 4060 Ti 8GB/16GB), the one whose memory is nearest
    ``total_bytes``. None when the catalogue does not know the card."""
    key = _norm(nvml_name)
    hits = [g for g in _CATALOGUE if key in {_norm(n) for n in g.nvml_names} or key == _norm(g.name)]
    if not hits:
        return None
    if total_bytes is None or len(hits) == 1:
        return hits[0]
    return min(hits, key=lambda g: abs(g.vram_bytes - total_bytes))
