"""The flag set of the llama.cpp binary an export is for, as data for
:func:`kvtuner.core.export.checked.check_export` (core reads no binary itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.export.checked import BuildFlags
from .engines import _cached_text, _sibling, parse_flags

if TYPE_CHECKING:  # pragma: no cover
    from .engines import Engine


def build_flags(engine: Engine | None, target: str = "llama-server") -> BuildFlags | None:
    """The flags ``engine``'s ``target`` binary accepts (``llama-server``: the engine's own
    ``--help``; ``llama-cli``: the ``llama-cli`` beside it, or the server itself when the engine
    *is* a llama-cli), or None when there is no such binary (the embedded engine, no llama-cli)."""
    if engine is None or engine.kind != "server" or engine.server is None:
        return None
    server = engine.server
    is_cli = server.name.startswith("llama-cli")
    if target == "llama-cli" and not is_cli:
        cli = _sibling(server, "llama-cli")
        if cli is None:
            return None
        _version, help_text = _cached_text(cli)
        flags = parse_flags(help_text)
        if not flags:
            return None
        return BuildFlags(engine.label.replace("llama-server", "llama-cli", 1), flags, str(cli))
    label = engine.label.replace("llama-server", "llama-cli", 1) if is_cli else engine.label
    return BuildFlags(label, engine.flags, str(server))
