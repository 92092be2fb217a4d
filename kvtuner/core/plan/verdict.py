"""The one fit verdict: does a memory plan fit its devices, and by how much.

Every place that says whether a configuration fits -- the window's badge, the advisor, the
tuner, ``kvtuner plan`` (text and ``--json``) and the export warning -- asks
:func:`fit_verdict`, so they cannot disagree. Three levels, per device and overall (the worst
device decides):

``fits``
    every GPU keeps the VRAM margin free (total <= capacity - ``vram_margin_bytes``) and the host
    keeps its RAM headroom (total <= (1 - ``ram_headroom_fraction``) x available RAM).
``tight``
    it loads, but inside the margin: a GPU holds its total but not the margin on top (the driver,
    the desktop or another program can push it out; llama-server's ``--fit``, when it is on, would
    change this configuration), or the host needs more than its headroom allows (swap risk).
``does not fit``
    a GPU's total is over its capacity, or the host's total is over the RAM available (installed
    when availability is unknown).

The margins are a setting (:class:`FitMargins`); the defaults are llama.cpp's own ``--fit``
target and the advisor's swap-risk line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..units import MiB, fmt_bytes

#: llama.cpp's ``--fit-target`` default: 1024 MiB kept free per device (common/common.h
#: ``fit_params_target``; common/arg.cpp ``-fitt, --fit-target``). llama-server's ``--fit`` lowers
#: the layers and the context until every device keeps this much free.
FIT_TARGET_MIB = 1024
#: Host RAM kept free: 20 % of the available RAM (room for the OS page cache and other programs;
#: past it the advisor warns of swapping).
RAM_HEADROOM_FRACTION = 0.20

FITS = "fits"
TIGHT = "tight"
DOES_NOT_FIT = "does not fit"
#: The levels from best to worst.
LEVELS = (FITS, TIGHT, DOES_NOT_FIT)


class VerdictError(ValueError):
    """Bad margins; the message says what to change."""


@dataclass(frozen=True)
class FitMargins:
    """What a plan must leave free to count as ``fits``.

    Attributes:
        vram_margin_bytes: VRAM kept free per GPU (bytes; default ``--fit-target`` 1024 MiB,
            :data:`FIT_TARGET_MIB`).
        ram_headroom_fraction: share of the host's available RAM kept free (0..1; default
            :data:`RAM_HEADROOM_FRACTION`).

    Raises:
        VerdictError: a negative margin or a fraction outside [0, 1).
    """

    vram_margin_bytes: int = FIT_TARGET_MIB * MiB
    ram_headroom_fraction: float = RAM_HEADROOM_FRACTION

    def __post_init__(self) -> None:
        if not isinstance(self.vram_margin_bytes, int) or self.vram_margin_bytes < 0:
            raise VerdictError(f"the VRAM margin must be a whole number of bytes >= 0, not {self.vram_margin_bytes!r}")
        if not isinstance(self.ram_headroom_fraction, (int, float)) or not 0 <= self.ram_headroom_fraction < 1:
            raise VerdictError(f"the RAM headroom must be a fraction in [0, 1), not {self.ram_headroom_fraction!r}")

    @property
    def source(self) -> str:
        """Where the margins come from, in words."""
        vram = f"{fmt_bytes(self.vram_margin_bytes)} of VRAM per GPU" + (
            " (llama.cpp's --fit-target default, common/common.h fit_params_target)"
            if self.vram_margin_bytes == FIT_TARGET_MIB * MiB
            else " (set by the user)"
        )
        ram = f"{self.ram_headroom_fraction:.0%} of the available RAM"
        return f"{vram}; {ram}"

    def to_dict(self) -> dict[str, Any]:
        """``{vram_margin_bytes, ram_headroom_fraction, source}``."""
        return {
            "vram_margin_bytes": self.vram_margin_bytes,
            "ram_headroom_fraction": self.ram_headroom_fraction,
            "source": self.source,
        }


@dataclass(frozen=True)
class DeviceVerdict:
    """The verdict for one device (bytes).

    Attributes:
        device: ``CUDA0``, ``RPC0[host:port]`` or ``CPU`` (the host).
        kind: ``gpu``, ``rpc`` or ``host``.
        name: the card's name or ``host``.
        level: :data:`FITS`, :data:`TIGHT` or :data:`DOES_NOT_FIT`; None when the capacity is
            unknown (nothing to compare with).
        need_bytes: the plan's total on the device.
        capacity_bytes: what the need is compared with: a GPU's memory; the host's available
            RAM, else its installed RAM (None: unknown).
        limit_bytes: the most the device may need and still ``fit``: capacity less the margin.
        why: one sentence with the numbers.
        backend_device: the device as its backend names it (``ROCm0``, ``Vulkan0``); "" means
            the same as ``device``.
    """

    device: str
    kind: str
    name: str
    level: str | None
    need_bytes: int
    capacity_bytes: int | None
    limit_bytes: int | None
    why: str
    backend_device: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (keys as the attributes)."""
        return {
            "device": self.device,
            "kind": self.kind,
            "name": self.name,
            "level": self.level,
            "need_bytes": self.need_bytes,
            "capacity_bytes": self.capacity_bytes,
            "limit_bytes": self.limit_bytes,
            "why": self.why,
            "backend_device": self.backend_device or self.device,
        }


@dataclass(frozen=True)
class FitVerdict:
    """Whether a plan fits: the worst device's level, every device's verdict and the margins used.

    Attributes:
        level: :data:`FITS`, :data:`TIGHT` or :data:`DOES_NOT_FIT` (devices of unknown capacity
            do not count; none known: :data:`FITS`).
        devices: per device, GPUs first then the host (the plan's order).
        margins: the margins applied.
    """

    level: str
    devices: tuple[DeviceVerdict, ...]
    margins: FitMargins

    @property
    def fits(self) -> bool:
        """Every device keeps its margin (level :data:`FITS`)."""
        return self.level == FITS

    @property
    def loads(self) -> bool:
        """Nothing is over capacity (level :data:`FITS` or :data:`TIGHT`)."""
        return self.level != DOES_NOT_FIT

    @property
    def gpu_fits(self) -> bool:
        """Every GPU keeps the VRAM margin (the host not considered)."""
        return all(d.level in (None, FITS) for d in self.devices if d.kind != "host")

    @property
    def host_fits(self) -> bool:
        """The host keeps its RAM headroom (GPUs not considered)."""
        return all(d.level in (None, FITS) for d in self.devices if d.kind == "host")

    def at_device(self, device: str) -> DeviceVerdict | None:
        """The verdict of ``device`` (``CUDA0``, ``CPU`` for the host), None if the plan has none."""
        return next((d for d in self.devices if d.device == device or (device == "host" and d.kind == "host")), None)

    def at(self, level: str) -> tuple[DeviceVerdict, ...]:
        """The devices at ``level``."""
        return tuple(d for d in self.devices if d.level == level)

    @property
    def detail(self) -> str:
        """The devices that set the level, each with its numbers (every device when it fits)."""
        worst = self.at(self.level) if self.level != FITS else ()
        if worst:
            return "; ".join(d.why for d in worst)
        known = [d for d in self.devices if d.level is not None]
        return "; ".join(d.why for d in known) if known else "no device has a known capacity"

    @property
    def why(self) -> str:
        """One line: the level, then :attr:`detail`."""
        return f"{self.level.capitalize()}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        """The ``fit`` object of ``kvtuner plan --json``: ``{level, why, margins, devices}``."""
        return {
            "level": self.level,
            "why": self.why,
            "margins": self.margins.to_dict(),
            "devices": [d.to_dict() for d in self.devices],
        }


def _gpu(d: Any, m: FitMargins) -> DeviceVerdict:
    cap, need = d.capacity_bytes, d.total_bytes
    label = getattr(d, "backend_device", d.device)
    if cap is None:
        return DeviceVerdict(d.device, d.kind, d.name, None, need, None, None, f"{label}: capacity unknown", label)
    limit = cap - m.vram_margin_bytes
    if need > cap:
        level, why = DOES_NOT_FIT, f"{label} needs {fmt_bytes(need)} of {fmt_bytes(cap)}, {fmt_bytes(need - cap)} over"
    elif need > limit:
        level, why = (
            TIGHT,
            (
                f"{label} needs {fmt_bytes(need)} of {fmt_bytes(cap)}, leaving {fmt_bytes(cap - need)} "
                f"free, under the {fmt_bytes(m.vram_margin_bytes)} margin"
            ),
        )
    else:
        level, why = (
            FITS,
            (
                f"{label} needs {fmt_bytes(need)} of {fmt_bytes(cap)}, keeping the "
                f"{fmt_bytes(m.vram_margin_bytes)} margin"
            ),
        )
    return DeviceVerdict(d.device, d.kind, d.name, level, need, cap, limit, why, label)


def _host(h: Any, m: FitMargins) -> DeviceVerdict:
    cap = h.free_bytes if h.free_bytes is not None else h.capacity_bytes
    need = h.total_bytes
    what = "available" if h.free_bytes is not None else "installed"
    if cap is None:
        return DeviceVerdict(h.device, h.kind, h.name, None, need, None, None, "host: RAM unknown")
    limit = int((1 - m.ram_headroom_fraction) * cap)
    if need > cap:
        level, why = (
            DOES_NOT_FIT,
            (f"host needs {fmt_bytes(need)} of {fmt_bytes(cap)} {what} RAM, {fmt_bytes(need - cap)} over"),
        )
    elif need > limit:
        level, why = (
            TIGHT,
            (
                f"host needs {fmt_bytes(need)} of {fmt_bytes(cap)} {what} RAM ({need / cap:.0%}), "
                f"more than {1 - m.ram_headroom_fraction:.0%}: swap risk"
            ),
        )
    else:
        level, why = FITS, f"host needs {fmt_bytes(need)} of {fmt_bytes(cap)} {what} RAM ({need / cap:.0%})"
    return DeviceVerdict(h.device, h.kind, h.name, level, need, cap, limit, why)


def fit_verdict(plan: Any, margins: FitMargins | None = None) -> FitVerdict:
    """The fit verdict of a :class:`~kvtuner.core.plan.memory_plan.MemoryPlan` (its ``devices``:
    GPUs and the host, each with ``total_bytes``, ``capacity_bytes``, ``free_bytes``).

    GPUs are compared with their capacity (a what-if card's total, a detected card's total memory),
    the host with its available RAM (installed when unknown); see the module docstring for the
    levels. Pure arithmetic.
    """
    m = margins or FitMargins()
    out = tuple(_host(d, m) if d.kind == "host" else _gpu(d, m) for d in plan.devices)
    known = [LEVELS.index(d.level) for d in out if d.level is not None]
    return FitVerdict(LEVELS[max(known)] if known else FITS, out, m)


#: Badge colours: the fit levels that replace the speed band, then the decode bands of
#: :func:`kvtuner.core.speed.speed_model.speed_band`.
BADGES = (DOES_NOT_FIT, TIGHT, "abandon", "offline", "interactive", "fluent")


def badge(verdict: FitVerdict, band: str | None) -> str | None:
    """The one badge for a plan: ``"does not fit"`` or ``"tight"`` when the verdict says so,
    else ``band`` (the speed band of the prediction, None without one)."""
    if verdict.level != FITS:
        return verdict.level
    return band


__all__ = [
    "BADGES",
    "DOES_NOT_FIT",
    "FITS",
    "FIT_TARGET_MIB",
    "LEVELS",
    "RAM_HEADROOM_FRACTION",
    "TIGHT",
    "DeviceVerdict",
    "FitMargins",
    "FitVerdict",
    "VerdictError",
    "badge",
    "fit_verdict",
]
