"""The analytic compute buffer against llama.cpp's own figure, over every configuration the tests cover.

For each configuration: kvtuner's plan (``plan_memory``, CPU only) and llama.cpp's no_alloc dry run
(``kvtuner.runner.dryrun``, a child process) of the same sparse GGUF; prints one row per
configuration and the distribution the docs page docs/accuracy/memory.md ("Compute buffer") reports.

The set is kvtuner/testing/compute_cases.py: ``CASES`` (tests/test_plan_vs_llama.py), ``FAMILIES x
CONFIGS`` and ``LONG`` (tests/test_model_families.py) and ``REAL`` (tests/test_compute_exact.py) (real-size shapes on
the CPU: flash attention auto/on/off, n_ubatch 512/1024/2048, several contexts).

    PYTHONPATH=. python benchmarks/compute_accuracy.py [--only SUBSTRING] [--markdown]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

MiB = 1 << 20


def timing() -> int:
    """Median and worst time of ``plan_memory`` per context step (a slider move: a new n_ctx each
    time, so no cache hit), CPU only, for the default model and real-size llama/MoE shapes."""
    import os
    import time

    from kvtuner.core.model.default_model import default_model_path
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.testing.compute_cases import EXTRA_SHAPES
    from kvtuner.testing.gguf_factory import write_real_shape

    with tempfile.TemporaryDirectory() as d:
        paths = {"gemma-3-270m (default)": default_model_path()}
        for shape in ("llama-2-7b", "qwen2.5-14b", "olmoe-1b-7b"):
            paths[shape] = write_real_shape(Path(d) / f"{shape}.gguf", EXTRA_SHAPES.get(shape, shape), "Q4_K_M")
        for label, path in paths.items():
            model = ModelProfile.from_gguf(path)
            times = []
            for i in range(40):
                t = time.perf_counter()
                plan_memory(model, PlanConfig(n_ctx=4096 + 256 * i))
                times.append(time.perf_counter() - t)
            times.sort()
            print(
                f"{label:24s} plan_memory per slider step: median {times[20] * 1e3:.2f} ms, "
                f"worst {times[-1] * 1e3:.2f} ms (load average {os.getloadavg()[0]:.2f})"
            )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="only configurations whose model name contains this")
    ap.add_argument("--markdown", action="store_true", help="print the distribution as a Markdown table")
    ap.add_argument("--timing", action="store_true", help="only time plan_memory over a slider of contexts")
    args = ap.parse_args()
    if args.timing:
        return timing()
    from kvtuner.core.model.default_model import default_model_path
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import ConfigError, PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.plan.reserve_graph import transformer_shape
    from kvtuner.runner import dryrun
    from kvtuner.testing.compute_cases import configurations

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for label, path, kwargs in configurations(Path(d), default_model_path()):
            if args.only and args.only not in label:
                continue
            config = PlanConfig(**kwargs)
            model = ModelProfile.from_gguf(path)
            try:
                plan = plan_memory(model, config)
            except ConfigError:
                continue  # refused by both (tests/test_model_families.py checks llama.cpp refuses it too)
            got = dryrun.dry_run(path, config)
            theirs = sum(got.compute_mib.values()) * MiB
            ours = plan.compute.bytes_on("CPU")
            err = ours / theirs - 1
            how = "graph" if transformer_shape(model, plan.kv_layers, config.type_k, config.type_v) else "phases"
            rows.append((label, kwargs, ours, theirs, err, how))
            print(
                f"{label:18s} {kwargs!s:95s} {how:6s} planned {ours / MiB:9.2f} llama.cpp {theirs / MiB:9.2f} "
                f"{err:+7.2%}",
                flush=True,
            )
    n = len(rows)
    within = {p: sum(abs(r[4]) <= p / 100 for r in rows) for p in (2, 5, 10)}
    worst = max(abs(r[4]) for r in rows)
    under = [r for r in rows if r[2] < 0.98 * r[3] - 8 * MiB]
    print(
        f"\n{n} configurations: within 2% {within[2]} ({within[2] / n:.0%}), within 5% {within[5]} "
        f"({within[5] / n:.0%}), within 10% {within[10]} ({within[10] / n:.0%}), worst {worst:.1%}, "
        f"under by more than 2% + 8 MiB: {len(under)}"
    )
    if args.markdown:
        print(
            "\n| configurations | exact (0.01 MiB) | within 2% | 5% | 10% | worst | under llama.cpp by more than 2% + 8 MiB |"
        )
        print("|---|---|---|---|---|---|---|")
        for title, sel in (
            ("all", rows),
            ("rebuilt graph", [r for r in rows if r[5] == "graph"]),
            ("phase estimate", [r for r in rows if r[5] == "phases"]),
        ):
            m = len(sel)
            if not m:
                continue
            exact = sum(f"{r[2] / MiB:.2f}" == f"{r[3] / MiB:.2f}" for r in sel)
            w = {p: sum(abs(r[4]) <= p / 100 for r in sel) for p in (2, 5, 10)}
            print(
                f"| {title} ({m}) | {exact} | {w[2]} ({w[2] / m:.0%}) | {w[5]} ({w[5] / m:.0%}) | "
                f"{w[10]} ({w[10] / m:.0%}) | {max(abs(r[4]) for r in sel):.1%} | "
                f"{sum(r[2] < 0.98 * r[3] - 8 * MiB for r in sel)} |"
            )
        print("\nMisses (over 2%):\n")
        for label, kwargs, ours, theirs, err, _how in rows:
            if abs(err) > 0.02:
                print(f"- {label} `{kwargs}`: {ours / MiB:.2f} vs {theirs / MiB:.2f} MiB ({err:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
