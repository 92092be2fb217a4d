"""kvtuner profile: one configuration with everything needed to judge it later (JSON).

Contents: the full :class:`~kvtuner.core.plan.config.PlanConfig`, the model's identity (file name,
size, header hash), the machine's hardware fingerprint, the llama.cpp build and the measured
results if any. :func:`load_profile` opens it again; a profile from another machine or for a
changed model file loads with warnings, a malformed one fails with one clear line.

Format (``"kvtuner_profile": 1``)::

    {"kvtuner_profile": 1, "kvtuner_version": "0.1.0", "created_utc": "2025-...Z",
     "model": {"path": ..., "file_name": ..., "file_bytes": ..., "header_sha256": ...,
               "architecture": ..., "n_layer": ..., "name": ...},
     "config": {PlanConfig fields}, "machine": {...} | null, "llama_cpp_build": "..." | null,
     "measured": {"decode_tok_s": ..., ...}, "note": "..." | null}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from ..hardware.identity import MachineFingerprint
from ..model.identity import ModelIdentity
from ..plan.config import ConfigError, PlanConfig
from ._common import ExportError, ExportResult, check_path_text, clean_measured, safe_stem

PROFILE_FORMAT = 1
#: Profiles larger than this are not kvtuner profiles (a real one is about 2 KiB).
MAX_PROFILE_BYTES = 1 << 20
PROFILE_SUFFIX = ".kvtuner.json"


class ProfileError(ExportError):
    """A file that is not a readable kvtuner profile; ``str()`` is one line naming the file."""


@dataclass(frozen=True)
class Profile:
    """A kvtuner profile as stored.

    Attributes:
        model_path: where the model was when the profile was made.
        model: its identity then.
        config: the configuration.
        machine: the machine it was made on, or None if not recorded.
        llama_cpp_build: the llama.cpp build(s) installed then, or None.
        measured: measured results (:data:`~kvtuner.core.export._common.MEASURED_KEYS`), may be empty.
        created_utc: ISO 8601 UTC time of writing.
        kvtuner_version: the kvtuner version that wrote it.
        note: free text from the user, or None.
    """

    model_path: Path
    model: ModelIdentity
    config: PlanConfig
    machine: MachineFingerprint | None = None
    llama_cpp_build: str | None = None
    measured: dict[str, float | int] = field(default_factory=dict)
    created_utc: str = ""
    kvtuner_version: str = ""
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to disk."""
        return {
            "kvtuner_profile": PROFILE_FORMAT,
            "kvtuner_version": self.kvtuner_version,
            "created_utc": self.created_utc,
            "model": {"path": str(self.model_path), **self.model.to_dict()},
            "config": self.config.to_dict(),
            "machine": self.machine.to_dict() if self.machine else None,
            "llama_cpp_build": self.llama_cpp_build,
            "measured": dict(self.measured),
            "note": self.note,
        }


def _kvtuner_version() -> str:
    try:
        from importlib import metadata

        return metadata.version("kvtuner")
    except Exception:
        return "unknown"


def render(
    model_path: Path,
    config: PlanConfig,
    model: ModelIdentity,
    *,
    machine: MachineFingerprint | None,
    llama_cpp_build: str | None,
    measured: Mapping[str, object] | None = None,
    created_utc: str | None = None,
    note: str | None = None,
) -> ExportResult:
    """The profile JSON.

    Raises:
        ExportError: bad measured values or an unusable path.
    """
    try:
        measured_clean = clean_measured(measured)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    profile = Profile(
        model_path=Path(check_path_text(model_path)),
        model=model,
        config=config,
        machine=machine,
        llama_cpp_build=llama_cpp_build,
        measured=measured_clean,
        created_utc=created_utc or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        kvtuner_version=_kvtuner_version(),
        note=note,
    )
    notes = (
        []
        if measured_clean
        else ["No measured results: this profile records a planned configuration, not a tested one."]
    )
    return ExportResult(
        target="profile",
        text=json.dumps(profile.to_dict(), indent=2, ensure_ascii=False) + "\n",
        filename_suggestion=f"{safe_stem(model_path)}{PROFILE_SUFFIX}",
        limitations=tuple(notes),
    )


def read_profile(path: str | Path) -> Profile:
    """Parse a profile file without judging it against this machine.

    Raises:
        ProfileError: missing, unreadable, too large, not JSON, not a kvtuner profile, a
            newer format, or a field of the wrong type (one line naming the file and field).
    """
    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
        if size > MAX_PROFILE_BYTES:
            raise ProfileError(f"{p}: {size} bytes is too large for a kvtuner profile")
        raw = p.read_bytes()
    except ProfileError:
        raise
    except IsADirectoryError:
        raise ProfileError(f"{p}: is a folder, not a profile file") from None
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProfileError(f"{p}: not a kvtuner profile (not UTF-8 text)") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProfileError(f"{p}: not a kvtuner profile (invalid JSON at line {getattr(exc, 'lineno', '?')})") from None
    if not isinstance(data, dict) or "kvtuner_profile" not in data:
        raise ProfileError(f"{p}: not a kvtuner profile (no 'kvtuner_profile' field)")
    fmt = data["kvtuner_profile"]
    if isinstance(fmt, bool) or not isinstance(fmt, int):
        raise ProfileError(f"{p}: 'kvtuner_profile' must be a format number")
    if fmt > PROFILE_FORMAT:
        raise ProfileError(
            f"{p}: written by a newer kvtuner (profile format {fmt}, this one reads {PROFILE_FORMAT}): update kvtuner"
        )
    if fmt < 1:
        raise ProfileError(f"{p}: unknown profile format {fmt}")
    try:
        model_raw = data.get("model")
        if not isinstance(model_raw, dict):
            raise ValueError("'model' is missing or not an object")
        model_path = model_raw.get("path")
        if not isinstance(model_path, str) or not model_path:
            raise ValueError("model.path is missing or not text")
        model = ModelIdentity.from_dict({k: v for k, v in model_raw.items() if k != "path"})
        config_raw = data.get("config")
        if not isinstance(config_raw, dict):
            raise ValueError("'config' is missing or not an object")
        _check_config_types(config_raw)
        config = PlanConfig.from_dict(config_raw)
        machine_raw = data.get("machine")
        machine = MachineFingerprint.from_dict(machine_raw) if machine_raw is not None else None
        build = data.get("llama_cpp_build")
        if build is not None and not isinstance(build, str):
            raise ValueError("llama_cpp_build must be text")
        measured = clean_measured(data.get("measured") or {})
        note = data.get("note")
        if note is not None and not isinstance(note, str):
            raise ValueError("note must be text")
        created = data.get("created_utc", "")
        version = data.get("kvtuner_version", "")
    except (ValueError, TypeError, ConfigError) as exc:
        raise ProfileError(f"{p}: malformed profile: {exc}") from None
    return Profile(
        model_path=Path(model_path),
        model=model,
        config=config,
        machine=machine,
        llama_cpp_build=build,
        measured=measured,
        created_utc=str(created),
        kvtuner_version=str(version),
        note=note,
    )


_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "n_ctx": (int,),
    "n_gpu_layers": (int,),
    "kv_gpu_layers": (int, type(None)),
    "type_k": (str,),
    "type_v": (str,),
    "flash_attn": (str,),
    "n_seq": (int,),
    "n_ubatch": (int,),
    "n_batch": (int,),
    "swa_full": (bool,),
    "kv_unified": (bool,),
    "use_mmap": (bool,),
}


def _check_config_types(raw: Mapping[str, Any]) -> None:
    """PlanConfig does not check types (a JSON string "8192" would compare wrongly later)."""
    for key, value in raw.items():
        allowed = _CONFIG_TYPES.get(key)
        if allowed is None:
            continue  # PlanConfig.from_dict names unknown keys
        if bool not in allowed and isinstance(value, bool):
            raise ValueError(f"config.{key} must be a number, not {value!r}")
        if not isinstance(value, allowed):
            raise ValueError(f"config.{key} has the wrong type ({type(value).__name__}): {value!r:.40}")


class LoadedProfile(NamedTuple):
    """What :func:`load_profile` returns: unpack as ``model_path, config, warnings = ...``."""

    model_path: Path
    config: PlanConfig
    warnings: tuple[str, ...]


def load_profile(
    path: str | Path,
    *,
    model_path: str | Path | None = None,
    machine: MachineFingerprint | None = None,
    llama_cpp_build: str | None = None,
) -> LoadedProfile:
    """Open a profile for use here: the model to plan, its configuration, and warnings.

    The model is looked for at ``model_path`` if given, else where the profile says, else
    next to the profile under the same file name. Warnings (one sentence each, never fatal):
    the model file is missing or unreadable, differs from the one profiled (size or header
    hash), the profile was made on another machine, or with another llama.cpp build.

    Args:
        path: the profile file.
        model_path: use this model file instead of the recorded one.
        machine: this machine (default: :meth:`MachineFingerprint.current`).
        llama_cpp_build: this machine's build (default: :func:`identity.llama_cpp_build`).

    Raises:
        ProfileError: the file is not a readable kvtuner profile (one line).
    """
    from ..hardware.identity import llama_cpp_build as current_build
    from ..model.gguf_header import GGUFError

    p = Path(path).expanduser()
    prof = read_profile(p)
    warnings: list[str] = []
    if model_path is not None:
        model = Path(model_path).expanduser()
    elif prof.model_path.is_file():
        model = prof.model_path
    elif (p.parent / prof.model.file_name).is_file():
        model = p.parent / prof.model.file_name
        warnings.append(f"model not found at {prof.model_path}; using {model} next to the profile.")
    else:
        model = prof.model_path
        warnings.append(f"model file {prof.model_path} not found: pass the model's path (MODEL) to use another copy.")
    if model.is_file():
        try:
            here = ModelIdentity.from_path(model)
        except (GGUFError, OSError) as exc:
            warnings.append(f"cannot read the model to check it: {exc}")
        else:
            if not here.same_file_as(prof.model):
                what = []
                if here.file_bytes != prof.model.file_bytes:
                    what.append(f"size {prof.model.file_bytes} -> {here.file_bytes} bytes")
                if here.header_sha256 != prof.model.header_sha256:
                    what.append("header hash differs")
                warnings.append(
                    f"model file {model.name} is not the one profiled ({', '.join(what)}): "
                    "the configuration and measured numbers may not hold; plan and measure again."
                )
    if prof.machine is not None:
        here_machine = machine or MachineFingerprint.current()
        diffs = prof.machine.differences(here_machine)
        if diffs:
            warnings.append(
                "profile made on another machine (" + "; ".join(diffs) + "): its measured numbers may not hold here."
            )
    else:
        warnings.append("profile has no machine fingerprint: cannot tell whether it was made on this machine.")
    build_here = llama_cpp_build or current_build()
    if prof.llama_cpp_build and prof.llama_cpp_build != build_here:
        warnings.append(f"profile made with {prof.llama_cpp_build}, this machine has {build_here}.")
    return LoadedProfile(model, prof.config, tuple(warnings))
