"""Runner overhead: the same decode through kvtuner's runner (10 Hz sampling on) and through
a bare llama-cpp-python loop, in the same run, on the embedded default model.

    .venv/bin/python benchmarks/runner_overhead.py [--gen 128] [--reps 5] [--rounds 3] [--threads 1]

Both sides run in a child process with the same llama.cpp parameters and the same work per
token: ``llama_decode`` of one token, then the argmax of its logits (greedy). Rounds
alternate runner / bare to spread machine noise evenly. Prints the decode tok/s of each
(median over all repetitions), their ratio (goal >= 0.97) and the sampler's CPU time as a
share of one core while it ran (goal < 1 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvtuner.core.model.default_model import default_model_path
from kvtuner.core.model.ggml_types import kv_type
from kvtuner.core.monitor.sampler import Sampler
from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner.bench import run_bench

BARE = r"""
import ctypes, json, sys, time
import numpy as np
import llama_cpp as lc
cfg = json.loads(sys.argv[2])
quiet = lc.llama_log_callback(lambda *a: None)  # keep a reference: llama.cpp calls it later
lc.llama_log_set(quiet, ctypes.c_void_p(0))
lc.llama_backend_init()
mp = lc.llama_model_default_params()
mp.load_mode = 1  # mmap, as the runner does for use_mmap
model = lc.llama_model_load_from_file(sys.argv[1].encode(), mp)
cp = lc.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = cfg["n_ctx"], cfg["n_batch"], cfg["n_ubatch"], 1
cp.n_threads = cp.n_threads_batch = cfg["threads"]
cp.type_k, cp.type_v, cp.flash_attn_type = cfg["type_k"], cfg["type_v"], cfg["fa"]
cp.swa_full, cp.kv_unified, cp.no_perf = False, False, False
ctx = lc.llama_init_from_model(model, cp)
n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
mem = lc.llama_get_memory(ctx)
def decode(tok):
    arr = (lc.llama_token * 1)(tok)
    assert lc.llama_decode(ctx, lc.llama_batch_get_one(arr, 1)) == 0
    return int(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).argmax())
lc.llama_memory_clear(mem, True); decode(1)  # warm-up, as the runner's
out = []
for rep in range(cfg["reps"]):
    lc.llama_memory_clear(mem, True)
    tok = 1
    t0 = time.perf_counter()
    for i in range(cfg["gen"]):
        tok = decode(tok)
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def bare_decode_s(model: Path, config: PlanConfig, gen: int, reps: int, threads: int) -> list[float]:
    cfg = {
        "n_ctx": config.n_ctx,
        "n_batch": config.n_batch,
        "n_ubatch": config.n_ubatch,
        "threads": threads,
        "type_k": kv_type(config.type_k).ggml_id,
        "type_v": kv_type(config.type_v).ggml_id,
        "fa": {"auto": -1, "off": 0, "on": 1}[config.flash_attn],
        "gen": gen,
        "reps": reps,
    }
    out = subprocess.run(
        [sys.executable, "-c", BARE, str(model), json.dumps(cfg)], capture_output=True, text=True, timeout=1800
    )
    if out.returncode != 0:
        raise SystemExit(f"bare loop failed with status {out.returncode}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gen", type=int, default=128, help="tokens decoded per repetition")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runner/bare rounds")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (both sides)")
    ap.add_argument("--interval", type=float, default=0.1, help="sampler interval, s (0.1 = 10 Hz)")
    args = ap.parse_args()

    model = default_model_path()
    config = PlanConfig(n_ctx=1024, flash_attn="on")
    runner_tok_s: list[float] = []
    bare_tok_s: list[float] = []
    sampler_cpu_s = sampler_wall_s = 0.0
    n_samples = 0
    for rnd in range(args.rounds):
        sampler = Sampler(interval_s=args.interval)
        t0 = time.monotonic()
        r = run_bench(
            model, config, n_prompt=0, n_gen=args.gen, repetitions=args.reps, n_threads=args.threads, sampler=sampler
        )
        sampler_wall_s += time.monotonic() - t0
        sampler_cpu_s += sampler.cpu_s
        n_samples += sampler.n_samples
        runner_tok_s += [rep["n_gen"] / rep["decode_s"] for rep in r.reps]
        bare_tok_s += [args.gen / s for s in bare_decode_s(model, config, args.gen, args.reps, args.threads)]
        print(
            f"round {rnd + 1}: runner {statistics.median(runner_tok_s[-args.reps :]):.2f} tok/s, "
            f"bare {statistics.median(bare_tok_s[-args.reps :]):.2f} tok/s",
            flush=True,
        )
    rm, bm = statistics.median(runner_tok_s), statistics.median(bare_tok_s)
    cpu_pct = 100.0 * sampler_cpu_s / sampler_wall_s if sampler_wall_s else 0.0
    print(
        f"model          {model.name}, n_ctx {config.n_ctx}, {args.threads} thread(s), {args.gen} tokens x "
        f"{args.reps} reps x {args.rounds} rounds"
    )
    print(f"runner decode  {rm:.2f} tok/s (median; min {min(runner_tok_s):.2f}, max {max(runner_tok_s):.2f})")
    print(f"bare decode    {bm:.2f} tok/s (median; min {min(bare_tok_s):.2f}, max {max(bare_tok_s):.2f})")
    print(f"ratio          {rm / bm:.3f} (goal >= 0.97)")
    print(
        f"sampler        {n_samples} samples at {1 / args.interval:.0f} Hz, {1000 * sampler_cpu_s:.1f} ms CPU in "
        f"{sampler_wall_s:.1f} s = {cpu_pct:.2f} % of one core (goal < 1 %)"
    )
    print(f"machine        {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
