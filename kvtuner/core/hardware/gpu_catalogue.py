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
from dataclasses import dataclass

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
    (``nvmlDeviceGetName``); ``arch``: ``pascal``, ``turing``, ``ampere``, ``ada``, ``hopper`` or
    ``blackwell``; ``source``: where the figures come from.
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
        """NVIDIA Turing and newer: MMQ runs on int8 ``mma`` tensor-core instructions."""
        return self.vendor == "NVIDIA" and self.arch != "pascal"

    def describe(self) -> str:
        """One line: ``RTX 3090: 24 GiB, 936 GB/s, FP16 tensor 142 TFLOPS, INT8 285 TOPS, PCIe 4.0 x16``."""
        return (f"{self.name}: {self.vram_bytes / GiB:g} GiB, {self.mem_bandwidth_bytes_s / 1e9:.0f} GB/s, "
                f"FP16 tensor {self.fp16_tensor_flop_s / 1e12:.0f} TFLOPS, INT8 {self.int8_op_s / 1e12:.0f} TOPS, "
                f"FP32 {self.fp32_flop_s / 1e12:.1f} TFLOPS, PCIe {self.pcie_gen}.0 x{self.pcie_lanes}")


#: Architectures of the other vendors' entries.
_VENDOR_OF_ARCH = {"rdna3": "AMD", "rdna3.5": "AMD", "rdna4": "AMD", "xe-hpg": "Intel", "xe2": "Intel",
                   "apple-m1": "Apple", "apple-m2": "Apple", "apple-m3": "Apple", "apple-m4": "Apple"}
#: Architectures whose entries are unified-memory chips (memory shared with the CPU).
UNIFIED_ARCHS = frozenset({"rdna3.5", "apple-m1", "apple-m2", "apple-m3", "apple-m4"})

_AMPERE = "NVIDIA Ampere GA102 GPU architecture whitepaper v2, appendix A (https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf)"
_ADA = "NVIDIA Ada GPU architecture whitepaper v2.1, appendix A (https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf)"
_BLACKWELL = "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix A (https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf)"
_TURING = "NVIDIA Turing GPU architecture whitepaper, appendix A (https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf)"


def _tensor(sms_tcs: int, boost_ghz: float, flop_per_clk: int) -> float:
    """Tensor FLOP/s = tensor cores x boost clock x dense FLOP per clock per tensor core."""
    return sms_tcs * boost_ghz * 1e9 * flop_per_clk


# Dense FP16 (FP16 accumulate) FLOP per clock per tensor core: Turing 128, Ampere GA10x 256,
# Ada 256, Blackwell GB20x 256; INT8 ops twice that (the whitepapers' tables).
_CATALOGUE: tuple[GpuModel, ...] = (
    GpuModel("Tesla P40", 24 * GiB, 346e9, 0.183e12, 47.0e12, 11.76e12, 3, 16, "pascal",
             "NVIDIA Tesla P40 datasheet (https://images.nvidia.com/content/pdf/tesla/184427-Tesla-P40-Datasheet-NV-Final-Letter-Web.pdf): "
             "346 GB/s, 11.76 TFLOPS FP32, 47 TOPS INT8; FP16 1/64 of FP32 on GP102", ("Tesla P40",)),
    GpuModel("Tesla T4", 16 * GiB, 320e9, 65e12, 130e12, 8.1e12, 3, 16, "turing",
             "NVIDIA T4 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf)",
             ("Tesla T4",)),
    GpuModel("RTX 2080 Ti", 11 * GiB, 616e9, _tensor(544, 1.545, 128), _tensor(544, 1.545, 256), 13.45e12, 3, 16, "turing",
             _TURING + ": 544 tensor cores, 1545 MHz boost, 14 Gbps x 352-bit", ("NVIDIA GeForce RTX 2080 Ti",)),
    GpuModel("RTX 3060 12GB", 12 * GiB, 360e9, _tensor(112, 1.777, 256), _tensor(112, 1.777, 512), 12.74e12, 4, 16, "ampere",
             _AMPERE + "; RTX 3060 product page: 112 tensor cores, 1777 MHz boost, 15 Gbps x 192-bit",
             ("NVIDIA GeForce RTX 3060",)),
    GpuModel("RTX 3070", 8 * GiB, 448e9, _tensor(184, 1.725, 256), _tensor(184, 1.725, 512), 20.31e12, 4, 16, "ampere",
             _AMPERE + ": 184 tensor cores, 1725 MHz boost, 14 Gbps x 256-bit", ("NVIDIA GeForce RTX 3070",)),
    GpuModel("RTX 3080 10GB", 10 * GiB, 760e9, _tensor(272, 1.71, 256), _tensor(272, 1.71, 512), 29.77e12, 4, 16, "ampere",
             _AMPERE + ": 272 tensor cores, 1710 MHz boost, 19 Gbps x 320-bit", ("NVIDIA GeForce RTX 3080",)),
    GpuModel("RTX 3080 Ti", 12 * GiB, 912e9, _tensor(320, 1.665, 256), _tensor(320, 1.665, 512), 34.1e12, 4, 16, "ampere",
             _AMPERE + "; RTX 3080 Ti product page: 320 tensor cores, 1665 MHz boost, 19 Gbps x 384-bit",
             ("NVIDIA GeForce RTX 3080 Ti",)),
    GpuModel("RTX 3090", 24 * GiB, 936.2e9, _tensor(328, 1.695, 256), _tensor(328, 1.695, 512), 35.58e12, 4, 16, "ampere",
             _AMPERE + ": 328 tensor cores, 1695 MHz boost, 19.5 Gbps x 384-bit", ("NVIDIA GeForce RTX 3090",)),
    GpuModel("RTX 3090 Ti", 24 * GiB, 1008e9, _tensor(336, 1.86, 256), _tensor(336, 1.86, 512), 40.0e12, 4, 16, "ampere",
             _AMPERE + "; RTX 3090 Ti product page: 336 tensor cores, 1860 MHz boost, 21 Gbps x 384-bit",
             ("NVIDIA GeForce RTX 3090 Ti",)),
    GpuModel("RTX A6000", 48 * GiB, 768e9, 154.8e12, 309.7e12, 38.7e12, 4, 16, "ampere",
             "NVIDIA RTX A6000 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf): "
             "768 GB/s, 38.7 TFLOPS FP32, 309.7 TFLOPS tensor with sparsity (dense half)", ("NVIDIA RTX A6000",)),
    GpuModel("A100 40GB", 40 * GiB, 1555e9, 312e12, 624e12, 19.5e12, 4, 16, "ampere",
             "NVIDIA A100 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)",
             ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB")),
    GpuModel("A100 80GB", 80 * GiB, 2039e9, 312e12, 624e12, 19.5e12, 4, 16, "ampere",
             "NVIDIA A100 datasheet (SXM4 80GB: 2039 GB/s HBM2e, 312 TFLOPS FP16 tensor, 624 TOPS INT8)",
             ("NVIDIA A100-SXM4-80GB",)),
    GpuModel("A100 80GB PCIe", 80 * GiB, 1935e9, 312e12, 624e12, 19.5e12, 4, 16, "ampere",
             "NVIDIA A100 datasheet (PCIe 80GB: 1935 GB/s HBM2e)", ("NVIDIA A100 80GB PCIe",)),
    GpuModel("RTX 4060", 8 * GiB, 272e9, _tensor(96, 2.46, 256), _tensor(96, 2.46, 512), 15.11e12, 4, 8, "ada",
             _ADA + "; RTX 4060 product page: 96 tensor cores, 2460 MHz boost, 17 Gbps x 128-bit, PCIe 4.0 x8",
             ("NVIDIA GeForce RTX 4060",)),
    GpuModel("RTX 4060 Ti 8GB", 8 * GiB, 288e9, _tensor(136, 2.535, 256), _tensor(136, 2.535, 512), 22.06e12, 4, 8, "ada",
             _ADA + "; RTX 4060 Ti product page: 136 tensor cores, 2535 MHz boost, 18 Gbps x 128-bit, PCIe 4.0 x8",
             ("NVIDIA GeForce RTX 4060 Ti",)),
    GpuModel("RTX 4060 Ti 16GB", 16 * GiB, 288e9, _tensor(136, 2.535, 256), _tensor(136, 2.535, 512), 22.06e12, 4, 8, "ada",
             _ADA + "; RTX 4060 Ti product page: 136 tensor cores, 2535 MHz boost, 18 Gbps x 128-bit, PCIe 4.0 x8",
             ("NVIDIA GeForce RTX 4060 Ti",)),
    GpuModel("RTX 4070 Ti", 12 * GiB, 504e9, _tensor(240, 2.61, 256), _tensor(240, 2.61, 512), 40.09e12, 4, 16, "ada",
             _ADA + "; RTX 4070 Ti product page: 240 tensor cores, 2610 MHz boost, 21 Gbps x 192-bit",
             ("NVIDIA GeForce RTX 4070 Ti",)),
    GpuModel("RTX 4080", 16 * GiB, 716.8e9, _tensor(304, 2.505, 256), _tensor(304, 2.505, 512), 48.74e12, 4, 16, "ada",
             _ADA + ": 304 tensor cores, 2505 MHz boost, 22.4 Gbps x 256-bit", ("NVIDIA GeForce RTX 4080",)),
    GpuModel("RTX 4090", 24 * GiB, 1008e9, _tensor(512, 2.52, 256), _tensor(512, 2.52, 512), 82.58e12, 4, 16, "ada",
             _ADA + ": 512 tensor cores, 2520 MHz boost, 21 Gbps x 384-bit", ("NVIDIA GeForce RTX 4090",)),
    GpuModel("RTX 5090", 32 * GiB, 1792e9, _tensor(680, 2.407, 256), _tensor(680, 2.407, 512), 104.8e12, 5, 16, "blackwell",
             _BLACKWELL + ": 680 tensor cores, 2407 MHz boost, 28 Gbps x 512-bit GDDR7", ("NVIDIA GeForce RTX 5090",)),
    GpuModel("H100 PCIe", 80 * GiB, 2039e9, 756.5e12, 1513e12, 51.2e12, 5, 16, "hopper",
             "NVIDIA H100 datasheet (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet): PCIe 80GB, "
             "2 TB/s, 1513 TFLOPS FP16 / 3026 TOPS INT8 with sparsity (dense half)", ("NVIDIA H100 PCIe",)),
    GpuModel("H100 SXM", 80 * GiB, 3352e9, 989.4e12, 1978.9e12, 66.9e12, 5, 16, "hopper",
             "NVIDIA H100 datasheet: SXM5 80GB, 3.35 TB/s, 1979 TFLOPS FP16 / 3958 TOPS INT8 with sparsity (dense half)",
             ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB")),
    GpuModel("H200", 141 * GiB, 4800e9, 989.4e12, 1978.9e12, 66.9e12, 5, 16, "hopper",
             "NVIDIA H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/): 141 GB HBM3e, 4.8 TB/s, "
             "1979 TFLOPS FP16 / 3958 TOPS INT8 with sparsity (dense half)", ("NVIDIA H200", "NVIDIA H200 NVL")),
)
# AMD, Intel and Apple: no tensor-core path in llama.cpp's rates here, so the FP16 and INT8 figures
# are the vector rates (FP16 = 2 x FP32 packed math; INT8 = the FP16 rate), the conservative figure
# for Vulkan/ROCm/SYCL/Metal kernels that do not use the matrix units.
_AMD = "AMD product specifications (https://www.amd.com/en/products/specifications/graphics.html)"
_INTEL = "Intel Arc product specifications (https://www.intel.com/content/www/us/en/products/details/discrete-gpus/arc.html)"
_APPLE = ("Apple newsroom / tech specs (memory bandwidth, memory size); FP32 = GPU cores x 128 lanes x 2 x clock "
          "(Apple publishes no clock: public measurements)")


def _vec(fp32_tflops: float) -> tuple[float, float, float]:
    """(FP16, INT8, FP32) FLOP/s of a card without a tensor-core path: FP16 = INT8 = 2 x FP32."""
    return 2 * fp32_tflops * 1e12, 2 * fp32_tflops * 1e12, fp32_tflops * 1e12


_OTHER_VENDORS: tuple[GpuModel, ...] = (
    GpuModel("RX 7600", 8 * GiB, 288e9, *_vec(21.75), 4, 8, "rdna3", _AMD + ": 18 Gbps x 128-bit, 21.75 TFLOPS FP32, PCIe 4.0 x8"),
    GpuModel("RX 7600 XT", 16 * GiB, 288e9, *_vec(22.57), 4, 8, "rdna3", _AMD + ": 18 Gbps x 128-bit, 22.57 TFLOPS FP32, PCIe 4.0 x8"),
    GpuModel("RX 7700 XT", 12 * GiB, 432e9, *_vec(35.17), 4, 16, "rdna3", _AMD + ": 18 Gbps x 192-bit, 35.17 TFLOPS FP32"),
    GpuModel("RX 7800 XT", 16 * GiB, 624e9, *_vec(37.32), 4, 16, "rdna3", _AMD + ": 19.5 Gbps x 256-bit, 37.32 TFLOPS FP32"),
    GpuModel("RX 7900 GRE", 16 * GiB, 576e9, *_vec(45.98), 4, 16, "rdna3", _AMD + ": 18 Gbps x 256-bit, 45.98 TFLOPS FP32"),
    GpuModel("RX 7900 XT", 20 * GiB, 800e9, *_vec(51.48), 4, 16, "rdna3", _AMD + ": 20 Gbps x 320-bit, 51.48 TFLOPS FP32"),
    GpuModel("RX 7900 XTX", 24 * GiB, 960e9, *_vec(61.39), 4, 16, "rdna3", _AMD + ": 20 Gbps x 384-bit, 61.39 TFLOPS FP32",
             ("AMD Radeon RX 7900 XTX", "Radeon RX 7900 XTX")),
    GpuModel("RX 9060 XT 16GB", 16 * GiB, 320e9, *_vec(25.64), 5, 16, "rdna4", _AMD + ": 20 Gbps x 128-bit, 25.64 TFLOPS FP32, PCIe 5.0 x16"),
    GpuModel("RX 9070", 16 * GiB, 640e9, *_vec(36.13), 5, 16, "rdna4", _AMD + ": 20 Gbps x 256-bit, 36.13 TFLOPS FP32, PCIe 5.0 x16"),
    GpuModel("RX 9070 XT", 16 * GiB, 640e9, *_vec(48.66), 5, 16, "rdna4", _AMD + ": 20 Gbps x 256-bit, 48.66 TFLOPS FP32, PCIe 5.0 x16"),
    GpuModel("Strix Halo 128GB", 128 * GiB, 256e9, *_vec(29.7), 0, 0, "rdna3.5",
             _AMD + " (Ryzen AI Max+ 395, Radeon 8060S): LPDDR5X-8000 x 256-bit shared with the CPU; 40 CUs x 2.9 GHz",
             ("AMD Radeon 8060S Graphics", "Radeon 8060S Graphics")),
    GpuModel("Arc A770 16GB", 16 * GiB, 560e9, *_vec(19.66), 4, 16, "xe-hpg", _INTEL + ": 17.5 Gbps x 256-bit, 32 Xe cores at 2.4 GHz",
             ("Intel(R) Arc(TM) A770 Graphics",)),
    GpuModel("Arc B580", 12 * GiB, 456e9, *_vec(13.67), 4, 8, "xe2", _INTEL + ": 19 Gbps x 192-bit, 20 Xe2 cores at 2.67 GHz, PCIe 4.0 x8",
             ("Intel(R) Arc(TM) B580 Graphics",)),
    GpuModel("M1 Max 64GB", 64 * GiB, 400e9, *_vec(10.4), 0, 0, "apple-m1", _APPLE + ": 400 GB/s, 32 GPU cores", ("Apple M1 Max",)),
    GpuModel("M2 Max 96GB", 96 * GiB, 400e9, *_vec(13.6), 0, 0, "apple-m2", _APPLE + ": 400 GB/s, 38 GPU cores", ("Apple M2 Max",)),
    GpuModel("M2 Ultra 192GB", 192 * GiB, 800e9, *_vec(27.2), 0, 0, "apple-m2", _APPLE + ": 800 GB/s, 76 GPU cores", ("Apple M2 Ultra",)),
    GpuModel("M3 Max 128GB", 128 * GiB, 400e9, *_vec(14.1), 0, 0, "apple-m3", _APPLE + ": 400 GB/s (16-core CPU), 40 GPU cores", ("Apple M3 Max",)),
    GpuModel("M4 Pro 48GB", 48 * GiB, 273e9, *_vec(9.2), 0, 0, "apple-m4", _APPLE + ": 273 GB/s, 20 GPU cores", ("Apple M4 Pro",)),
    GpuModel("M4 Max 128GB", 128 * GiB, 546e9, *_vec(16.2), 0, 0, "apple-m4", _APPLE + ": 546 GB/s (16-core CPU), 40 GPU cores", ("Apple M4 Max",)),
)

_CATALOGUE = _CATALOGUE + _OTHER_VENDORS

#: The catalogue by name.
GPU_CATALOGUE: dict[str, GpuModel] = {g.name: g for g in _CATALOGUE}


def _norm(text: str) -> str:
    """Lower case, vendor words (nvidia, geforce, tesla) and every non-alphanumeric dropped."""
    t = re.sub(r"\b(nvidia|geforce|tesla|amd|radeon|intel|apple)\b", " ", text.lower())
    return re.sub(r"[^a-z0-9]", "", t)


class UnknownGpuError(ValueError):
    """A GPU name the catalogue does not know (or that names several entries); the message lists
    the catalogue's names."""


def find_gpu(name: str) -> GpuModel:
    """The catalogue entry a user names (``"RTX 3090"``, ``"rtx3090"``, ``"NVIDIA GeForce RTX 3090"``):
    case, spaces, dashes and the words NVIDIA/GeForce/Tesla do not matter; a unique entry whose
    name contains the text also matches (``"5090"``).

    Raises:
        UnknownGpuError: no entry, or several (the message says which, or lists the catalogue).
    """
    key = _norm(name)
    if not key:
        raise UnknownGpuError(f"empty GPU name; known GPUs: {', '.join(GPU_CATALOGUE)}")
    exact = [g for g in _CATALOGUE if _norm(g.name) == key or key in {_norm(n) for n in g.nvml_names}]
    if len(exact) == 1:
        return exact[0]
    partial = exact or [g for g in _CATALOGUE if key in _norm(g.name)]
    if len(partial) == 1:
        return partial[0]
    ending = [g for g in partial if _norm(g.name).endswith(key)]  # "7900 XT": RX 7900 XT, not XTX
    if len(ending) == 1:
        return ending[0]
    if partial:
        raise UnknownGpuError(f"GPU {name!r} matches several catalogue entries: {', '.join(g.name for g in partial)}; "
                              "name one of them")
    raise UnknownGpuError(f"GPU {name!r} is not in the catalogue (kvtuner gpus lists it): known GPUs are "
                          f"{', '.join(GPU_CATALOGUE)}; or give its memory size with --gpu-mem")


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
