"""Host memory configurations a user can name (``--host-mem DDR4-3200x2``): theoretical and
typical achieved bandwidth, so a speed prediction can be made for another host than this one.

A name is ``TYPE-MTSxCHANNELS``: the memory type, its data rate in MT/s and the number of
64-bit channels populated (a desktop with two DIMMs on a dual-channel board is ``x2``; a quad-channel
workstation ``x4``; an 8-channel EPYC ``x8``; a laptop's LPDDR5 on a 128-bit bus ``x2``).

- Theoretical bandwidth, bytes/s = MT/s x 1e6 x 8 bytes (one 64-bit channel) x channels (JEDEC
  JESD79-4 DDR4 and JESD79-5 DDR5: a DDR5 DIMM's two 32-bit subchannels make one 64-bit channel).
- Typical achieved bandwidth = theoretical x the type's :data:`MEMORY_TYPES` efficiency: what a
  multi-threaded read benchmark reaches on common desktops and laptops (each type names its
  source). llama.cpp's CPU decode streams the weights once per token, so this is the ceiling of
  its host-resident weights' bytes/s; a user who measured their own gives ``--host-bw`` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Bytes per transfer of one channel (64-bit).
CHANNEL_BYTES = 8


@dataclass(frozen=True)
class MemoryType:
    """One memory type: ``efficiency`` (typical achieved / theoretical read bandwidth), the data
    rates it is sold at (MT/s, for the range check) and the ``source`` of the efficiency."""

    name: str
    efficiency: float
    min_mt_s: int
    max_mt_s: int
    source: str


#: Memory types by name. Efficiencies: read benchmarks' share of the theoretical figure.
MEMORY_TYPES: dict[str, MemoryType] = {
    t.name: t
    for t in (
        MemoryType(
            "DDR3",
            0.80,
            800,
            2400,
            "read benchmarks of dual-channel DDR3 desktops reach about 80% of the theoretical figure "
            "(as DDR4 below, with older memory controllers)",
        ),
        MemoryType(
            "DDR4",
            0.88,
            1600,
            4800,
            "Guru3D's AIDA64 memory read of dual-channel DDR4-3200: about 46 GB/s of 51.2 (0.90; "
            "https://guru3d.com/review/g-skill-tridentz-royal-ddr4-3200-mhz-review/page-10) and 43 GB/s on Z170 "
            "(0.84; https://guru3d.com/review/gigabyte-z170x-gaming-g1-review/page-17)",
        ),
        MemoryType(
            "DDR5",
            0.72,
            4000,
            9600,
            "AIDA64 read of dual-channel DDR5-6000: Ryzen 7000 reads are bound by the Infinity Fabric at about "
            "62-64 GB/s of 96 (0.66; https://silverflick.com/2000mhz-fclk-ddr5-6000-seems-optimal-for-ryzen-7000-cpus/), "
            "Intel desktops reach about 0.8; 0.72 between them",
        ),
        MemoryType(
            "LPDDR4X",
            0.75,
            3200,
            4266,
            "laptop LPDDR read benchmarks reach 0.65-0.85 of the theoretical figure "
            "(https://www.notebookchat.com/index.php?action=post&quote=738429&topic=296818); the middle",
        ),
        MemoryType(
            "LPDDR5",
            0.75,
            4800,
            6400,
            "laptop LPDDR read benchmarks reach 0.65-0.85 of the theoretical figure "
            "(https://www.notebookchat.com/index.php?action=post&quote=738429&topic=296818); the middle",
        ),
        MemoryType(
            "LPDDR5X",
            0.75,
            6400,
            10700,
            "laptop LPDDR read benchmarks reach 0.65-0.85 of the theoretical figure "
            "(https://www.notebookchat.com/index.php?action=post&quote=738429&topic=296818); the middle",
        ),
    )
}

#: Configurations shown as examples (the GUI's host presets and the docs' table).
EXAMPLE_CONFIGS: tuple[str, ...] = (
    "DDR4-2666x2",
    "DDR4-3200x2",
    "DDR4-3600x2",
    "DDR4-3200x4",
    "DDR5-4800x2",
    "DDR5-5600x2",
    "DDR5-6000x2",
    "DDR5-6400x2",
    "DDR5-4800x8",
    "LPDDR5-6400x2",
    "LPDDR5X-8533x2",
)


class HostMemoryError(ValueError):
    """A memory configuration that cannot be read; the message says what to give."""


@dataclass(frozen=True)
class HostMemory:
    """A named memory configuration: ``kind`` (a :data:`MEMORY_TYPES` key), ``mt_s`` (data rate,
    MT/s), ``channels`` (64-bit channels); bandwidths in bytes/s."""

    kind: str
    mt_s: int
    channels: int

    @property
    def name(self) -> str:
        """``DDR4-3200x2``."""
        return f"{self.kind}-{self.mt_s}x{self.channels}"

    @property
    def theoretical_bytes_s(self) -> float:
        """MT/s x 8 bytes x channels (module docstring)."""
        return self.mt_s * 1e6 * CHANNEL_BYTES * self.channels

    @property
    def typical_bytes_s(self) -> float:
        """The theoretical figure x the type's typical efficiency (:data:`MEMORY_TYPES`)."""
        return self.theoretical_bytes_s * MEMORY_TYPES[self.kind].efficiency

    @property
    def source(self) -> str:
        """Where the typical efficiency comes from."""
        return MEMORY_TYPES[self.kind].source

    def to_dict(self) -> dict[str, object]:
        """``{"name", "type", "mt_s", "channels", "theoretical_bytes_s", "typical_bytes_s", "source"}``."""
        return {
            "name": self.name,
            "type": self.kind,
            "mt_s": self.mt_s,
            "channels": self.channels,
            "theoretical_bytes_s": self.theoretical_bytes_s,
            "typical_bytes_s": self.typical_bytes_s,
            "source": self.source,
        }


def parse_host_memory(text: str) -> HostMemory:
    """Read ``TYPE-MTSxCHANNELS`` (``DDR4-3200x2``, ``ddr5 6000 x2``, ``LPDDR5X-8533x2``; case and
    spaces do not matter).

    Raises:
        HostMemoryError: another shape, an unknown type, a data rate outside what the type is
            sold at, or channels outside 1..16.
    """
    t = re.sub(r"[\s_-]+", "-", (text or "").strip()).upper()
    m = re.fullmatch(r"([A-Z0-9]+)-(\d{3,5})(?:-?MT/?S)?-?X-?(\d{1,2})", t)
    if not m:
        raise HostMemoryError(
            f"{text.strip()!r} is not a memory configuration: give TYPE-MTSxCHANNELS, e.g. DDR4-3200x2 or DDR5-6000x2"
        )
    kind, mt_s, channels = m.group(1), int(m.group(2)), int(m.group(3))
    if kind not in MEMORY_TYPES:
        raise HostMemoryError(
            f"{text.strip()!r}: memory type {kind} is not known; give one of {', '.join(MEMORY_TYPES)}"
        )
    mt = MEMORY_TYPES[kind]
    if not mt.min_mt_s <= mt_s <= mt.max_mt_s:
        raise HostMemoryError(f"{text.strip()!r}: {kind} runs at {mt.min_mt_s}-{mt.max_mt_s} MT/s, not {mt_s}")
    if not 1 <= channels <= 16:
        raise HostMemoryError(f"{text.strip()!r}: give 1 to 16 64-bit channels, not {channels}")
    return HostMemory(kind, mt_s, channels)


def parse_pcie_link(text: str) -> tuple[int, int]:
    """Read a PCIe link ``GENxLANES`` (``4x16``, ``3x4`` for a Thunderbolt 3 eGPU, ``PCIe 4.0 x8``).

    Raises:
        HostMemoryError: another shape, a generation outside 1-6 or lanes not 1, 2, 4, 8 or 16.
    """
    from .gpu_catalogue import PCIE_LANE_BYTES_S

    t = re.sub(r"\s+", "", text or "").lower().removeprefix("pcie").removeprefix("gen")
    m = re.fullmatch(r"(\d)(?:\.0)?x(\d{1,2})", t)
    if not m:
        raise HostMemoryError(f"{text.strip()!r} is not a PCIe link: give GENxLANES, e.g. 4x16 or 3x4")
    gen, lanes = int(m.group(1)), int(m.group(2))
    if gen not in PCIE_LANE_BYTES_S:
        raise HostMemoryError(f"{text.strip()!r}: PCIe generation {gen} does not exist; give 1 to 6")
    if lanes not in (1, 2, 4, 8, 16):
        raise HostMemoryError(f"{text.strip()!r}: a PCIe link has 1, 2, 4, 8 or 16 lanes, not {lanes}")
    return gen, lanes
