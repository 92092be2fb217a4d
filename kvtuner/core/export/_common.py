"""What every exporter shares: the result type, errors, the KV placement split and atomic writes.

Pure Python: no Qt, no llama_cpp (the import-linter contract on ``kvtuner.core`` checks it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..fileio import write_temp
from ..plan.config import ConfigError, PlanConfig
from ..plan.placement import LayerPlacement, layer_regex, placement_for


class ExportError(ValueError):
    """An export that cannot be produced or written; ``str()`` is one line saying what to change."""


@dataclass(frozen=True)
class ExportResult:
    """One exported configuration.

    Attributes:
        target: the target name (``llama-server``, ``ollama`` ...), see :data:`kvtuner.core.export.TARGETS`.
        text: the file or command text, ready to save or paste (ends with a newline).
        filename_suggestion: a file name (no directory) for saving ``text``.
        limitations: one sentence per thing the target cannot express exactly, or that the
            user must do by hand; empty when the export is exact.
        argv: for command-line targets, the argument vector ``text`` encodes (unquoted);
            None for file targets.
        env: environment variables the target needs set (Ollama's server settings ...).
        experimental: True when the export relies on an untested mechanism (the partial KV
            split through tensor overrides, :mod:`kvtuner.core.plan.placement`).
        warnings: one sentence per reason the export will not run as planned (it does not fit,
            or the target cannot express the placement); the CLI prints them as warnings.
    """

    target: str
    text: str
    filename_suggestion: str
    limitations: tuple[str, ...] = ()
    argv: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    experimental: bool = False
    warnings: tuple[str, ...] = ()


def check_path_text(model_path: Path) -> str:
    """The model path as text every target can hold (absolute, valid UTF-8).

    Raises:
        ExportError: the name has bytes that are not UTF-8 (no text file can carry it).
    """
    text = str(Path(model_path).expanduser().absolute())
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ExportError(
            f"model path {text!r} is not valid UTF-8 and cannot be written into a command or file: rename the file"
        ) from None
    return text


# ---------------------------------------------------------------------------------------------
def kv_placement(config: PlanConfig, n_layer: Callable[[], int]) -> LayerPlacement:
    """The planner's placement rule (:func:`kvtuner.core.plan.placement.placement_for`) for an
    export: ``n_layer`` is called only when the answer depends on it, so exports of plain
    configurations never read the model.

    Raises:
        ExportError: ``kv_gpu_layers`` exceeds the offloaded repeating layers.
    """
    try:
        return placement_for(config, n_layer)
    except ConfigError as exc:
        raise ExportError(str(exc)) from None


def override_pattern(layers: tuple[int, ...], buffer_type: str) -> str:
    """The ``-ot`` value moving every tensor of ``layers`` to ``buffer_type``
    (:func:`kvtuner.core.plan.placement.layer_regex` ``=`` buffer)."""
    return layer_regex(layers) + "=" + buffer_type


# ---------------------------------------------------------------------------------------------
#: Test hook: called with the temporary file's path after it is written and synced, before
#: the rename. Tests set it in a child process to kill that process mid-save.
_before_replace_hook: Callable[[Path], None] | None = None


#: The first line of a shell-script export (``.sh``).
SHEBANG = "#!/bin/sh\n"


def write_export(result: ExportResult, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Save an export (:func:`write_text_atomic`): a shell script (a name ending in ``.sh``, as the
    llama-server, llama-cli and vLLM exports suggest) starts with :data:`SHEBANG` and is written
    executable; any other file is ``result.text`` as is.

    Raises:
        ExportError: as :func:`write_text_atomic`.
    """
    script = os.fspath(path).endswith(".sh")
    text = result.text
    if script and not text.startswith("#!"):
        text = SHEBANG + text
    return write_text_atomic(path, text, force=force, executable=script)


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, force: bool = False, executable: bool = False
) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically: a temporary file in the same folder,
    flushed and fsynced, then renamed over the target. A crash or kill at any moment leaves
    either the old file or the new one, never a mix (a stray hidden ``.*.tmp`` at worst).

    Without ``force`` an existing file is never replaced, even one created by someone else
    during the write (the final step is a hard link, which fails if the name exists).

    ``executable``: add the execute bits wherever the file is readable (mode 0755 for a new file).

    Returns:
        The path written.

    Raises:
        ExportError: the file exists and ``force`` is False, or the folder is not writable.
    """
    raw = os.fspath(path)
    if not raw.strip():
        raise ExportError("empty file name: give the file to write")
    target = Path(path).expanduser()
    if target.is_dir() or raw.endswith(("/", os.sep)):
        # "out/" names a folder even when it does not exist yet (Path() drops the slash)
        raise ExportError(f"{raw} is a folder: give a file name")
    if target.is_symlink() and target.exists():
        # write through a link to a file (as shell redirection does) instead of replacing the link
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file():
        # /dev/null, a FIFO, a socket: os.replace would swap the special file for a regular one
        raise ExportError(f"{target} is not a regular file: give a file path (without -o the text goes to stdout)")
    if target.exists() and not force:
        raise ExportError(f"{target} already exists: pass --force to overwrite it, or choose another name")
    folder = target.parent if str(target.parent) else Path(".")
    try:
        tmp = write_temp(folder, target.name, text)
    except OSError as exc:
        raise ExportError(f"cannot write into {folder}: {exc.strerror or exc}") from None
    try:
        try:
            mode = target.stat().st_mode & 0o777 if target.exists() else (0o755 if executable else 0o644)
            if executable:
                mode |= (mode & 0o444) >> 2  # x wherever r
            os.chmod(tmp, mode)
        except OSError:
            pass
        if _before_replace_hook is not None:
            _before_replace_hook(tmp)
        if force:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise ExportError(
                    f"{target} already exists: pass --force to overwrite it, or choose another name"
                ) from None
            except OSError:
                # file systems without hard links (FAT, some network shares): best effort
                if target.exists():
                    raise ExportError(
                        f"{target} already exists: pass --force to overwrite it, or choose another name"
                    ) from None
                os.replace(tmp, target)
            tmp.unlink(missing_ok=True)
        _fsync_dir(folder)
    except ExportError:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def safe_stem(model_path: Path) -> str:
    """A file-name-safe stem from the model file name (``gemma-3-270m-q4_k_m``)."""
    name = Path(model_path).name
    for suffix in (".gguf",):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    out = "".join(c if (c.isascii() and (c.isalnum() or c in "-_.")) else "_" for c in name).strip("._")
    return out or "model"


# ---------------------------------------------------------------------------------------------
#: Measured figures a run reports (units in the names): tokens/s, seconds, bytes.
MEASURED_KEYS = ("decode_tok_s", "prefill_tok_s", "load_s", "peak_vram_bytes", "peak_rss_bytes", "kv_bytes")


def clean_measured(measured: Mapping[str, object] | None) -> dict[str, float | int]:
    """Check a dict of measured figures: numbers, finite, not negative; None values dropped.

    Keys other than :data:`MEASURED_KEYS` are kept if numeric (a runner may report more).

    Raises:
        ValueError: a value that is not a finite non-negative number (message names the key).
    """
    import math

    out: dict[str, float | int] = {}
    if measured is None:
        return out
    if not isinstance(measured, Mapping):
        raise ValueError("measured results must be a mapping of name to number")
    for key, value in measured.items():
        if value is None:
            continue
        if not isinstance(key, str) or not key:
            raise ValueError(f"measured result name {key!r} must be text")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"measured {key} must be a number, not {value!r:.40}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"measured {key} must be a finite number >= 0, not {value}")
        out[key] = int(value) if key.endswith("_bytes") else value
    return out
