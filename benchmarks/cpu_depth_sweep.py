"""Decode time per token at several KV depths on this CPU, measured and predicted cold.

For each depth, loads the model in a runner child (no GPU), fills the cache, prefills 64 tokens
and decodes 48 (``kvtuner bench -p 64 -n 48 -d D``, one repetition), printing the median
and the fastest token time; then the speed model's cold prediction (the stored CPU probe of this
machine and thread count, no calibration) at the same depths. Shows where decode at depth departs
from the probe's per-cell attention cost (benchmarks/results/2026-12-01-cpu-depth-sweep.md).

    python benchmarks/cpu_depth_sweep.py [MODEL] --ctx 32768 --depths 0,8192,16384,24576,32544 -t 2

A depth of 32 544 on the default model takes about 3.5 minutes here (the cache fill is a prefill).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> int:
    from dataclasses import replace

    from kvtuner.core.hardware.host import detect_host
    from kvtuner.core.model.default_model import default_model_path
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.calibration import CalibrationStore
    from kvtuner.core.speed.speed_model import decode_tok_s, speed_inputs
    from kvtuner.runner import protocol as P
    from kvtuner.runner.bench import run_bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--depths", default="0,8192,16384,24576,32544")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    path = args.model or str(default_model_path())
    depths = [int(d) for d in args.depths.split(",")]
    cfg = PlanConfig(n_ctx=args.ctx, n_gpu_layers=0, flash_attn="on", n_batch=2048, n_ubatch=512)

    measured: dict[int, tuple[float, float]] = {}
    for d in depths:
        toks: list[float] = []

        def keep(ev: P.Message) -> None:
            if isinstance(ev, P.TokenEvent):
                toks.append(ev.dt_s)  # noqa: B023 (runs within this iteration)

        t0 = time.time()
        run_bench(
            path,
            cfg,
            n_prompt=64,
            n_gen=48,
            n_depth=d,
            repetitions=1,
            n_threads=args.threads,
            timeout_s=3600,
            idle_timeout_s=3600,
            on_event=keep,
            env={"CUDA_VISIBLE_DEVICES": ""},
        )
        measured[d] = (statistics.median(toks), min(toks))
        print(f"# depth {d}: {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)

    model = ModelProfile.from_gguf(path)
    plan = plan_memory(model, cfg, [], detect_host())
    store = CalibrationStore()
    host = detect_host()
    bw = store.host_bandwidth_bytes_s(measure=False)
    if bw:
        host = replace(host, mem_bandwidth_bytes_s=bw)
    cpu = store.cpu_rates(args.threads)
    if cpu is None:
        print("no stored CPU probe for this thread count: run `kvtuner probe -t N` first")
        return 2
    inputs = speed_inputs([], host, n_threads=args.threads, measure=False, cpu=cpu)
    print(
        "| depth | measured ms/token, median (fastest) | predicted cold ms/token | error (predicted speed / measured - 1) |"
    )
    print("|---:|---:|---:|---:|")
    for d in depths:
        med, fast = measured[d]
        pred = 1.0 / decode_tok_s(plan, inputs, min(d + 64, plan.n_ctx_seq - 1))
        print(f"| {d} | {med * 1e3:.1f} ({fast * 1e3:.1f}) | {pred * 1e3:.1f} | {med / pred - 1:+.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
