"""CPU speed of MoE models (issue 12): the expert-matmul efficiency of a host prefill, fitted on one
row and checked on rows nobody fitted to.

On a CPU-only run every expert is on the host, so these runs are "experts on the CPU" at their
purest: a token reads n_expert_used / n_expert of each layer's experts and the CPU computes them.
The measurements are real runs of zero-weight sparse GGUF files of real MoE shapes through
kvtuner's runner (``kvtuner bench -p 128 -n 32 -r 1 -d D``, -t 1, cold: the CPU probe, no
calibration), like benchmarks/speed_validation.py, whose stored runs this reuses:

    fitting set     granite-3.0-1b-a400m Q4_K_M, depth 0 (SpeedConstants.host_moe_prefill_efficiency)
    validation set  granite-3.0-1b-a400m Q4_K_M depth 2048 (same model, other depth: a weaker check),
                    olmoe-1b-7b Q4_K_M and qwen1.5-moe-a2.7b Q4_K_M at depths 0 and 2048
                    (benchmarks/speed_cpu_runs.json, measured before this constant existed), and
                    the rows of benchmarks/moe_cpu_runs.json measured here with --measure:
                    Qwen3-30B-A3B's per-layer shapes (qwen3moe, 128 experts / 8 used) with 8 of its
                    48 layers (the full model does not fit beside three other jobs in 24 GiB),
                    each benched between two runs of the fitting row (the "anchor"), so that a
                    measurement taken while other jobs load the machine can be read against the
                    slowdown they caused (its quiet-machine speed is stored)

Errors are ``predicted / measured - 1``.

    python benchmarks/moe_cpu_validation.py --fit       # fit the efficiency on the fitting row
    python benchmarks/moe_cpu_validation.py             # print every row (prediction vs measurement)
    python benchmarks/moe_cpu_validation.py --measure   # bench the extra rows (a few minutes, 1 thread)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import speed_validation as SV  # noqa: E402

STORED = ROOT / "benchmarks" / "speed_cpu_runs.json"
EXTRA = ROOT / "benchmarks" / "moe_cpu_runs.json"
FIT_ROW = ("granite-3.0-1b-a400m", "Q4_K_M", 0)
MOE_KEYS = ("granite-3.0-1b-a400m", "olmoe-1b-7b", "qwen1.5-moe-a2.7b")
#: the extra shapes: (key, real shape, layers kept, file type)
EXTRA_SHAPES = [("qwen3-30b-a3b-8l", "qwen3-30b-a3b", 8, "Q4_K_M")]


def _real_shape(key: str):
    from gguf_factory import REAL_SHAPES, RealShape

    if key == "qwen3-30b-a3b":
        # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
        return RealShape("qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 6144, 151936, 40960, False,
                         "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json", head_dim=128,
                         qk_norm="head", n_expert=128, n_expert_used=8, n_ff_exp=768)
    return REAL_SHAPES[key]


def fixture(key: str, ftype: str, directory: Path) -> Path:
    for k, shape, n_layer, ft in EXTRA_SHAPES:
        if k == key:
            from gguf_factory import write_real_shape

            path = directory / f"{key}-{ft}.gguf"
            if not path.exists():
                write_real_shape(path, replace(_real_shape(shape), n_layer=n_layer, key=key), ft)
            return path
    return SV.fixture(key, ftype, directory)


def predict(rows: list[dict], probe: dict, directory: Path, efficiency: float | None = None) -> list[dict]:
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.cpu_probe import CpuRates
    from kvtuner.core.speed.speed_model import SpeedConstants, decode_tok_s, prefill_tok_s, speed_inputs

    rates = CpuRates.from_dict(probe)
    host = HostSpec(total_bytes=64 << 30, available_bytes=48 << 30, mem_bandwidth_bytes_s=20e9)
    consts = SpeedConstants() if efficiency is None else SpeedConstants(host_moe_prefill_efficiency=efficiency)
    out = []
    for r in rows:
        prof = ModelProfile.from_gguf(fixture(r["key"], r["ftype"], directory))
        plan = plan_memory(prof, SV.cpu_config(r["depth"]), [], host)
        inp = speed_inputs([], host, n_threads=r["threads"], cpu=rates, constants=consts)
        dd = r["depth"] + SV.CPU_PROMPT + (SV.CPU_GEN - 1) // 2
        out.append({**r, "pred_prefill": prefill_tok_s(plan, inp, SV.CPU_PROMPT, r["depth"]),
                    "pred_decode": decode_tok_s(plan, inp, dd)})
    return out


def fit(rows: list[dict], probe: dict, directory: Path) -> float:
    """The efficiency that makes the fitting row's prefill prediction equal its measurement (bisection)."""
    (row,) = [r for r in rows if (r["key"], r["ftype"], r["depth"]) == FIT_ROW]
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        p = predict([row], probe, directory, mid)[0]["pred_prefill"]
        lo, hi = (mid, hi) if p < row["prefill_tok_s"] else (lo, mid)
    return (lo + hi) / 2


def _bench(path: Path, depth: int, threads: int) -> dict:
    from kvtuner.runner.bench import run_bench

    t0 = time.time()
    r = run_bench(path, SV.cpu_config(depth), n_prompt=SV.CPU_PROMPT, n_gen=SV.CPU_GEN, n_depth=depth, repetitions=1,
                  n_threads=threads, timeout_s=3600, idle_timeout_s=3600)
    return {"depth": depth, "threads": threads, "prefill_tok_s": r.prefill_tok_s.median,
            "decode_tok_s": r.decode_tok_s.median, "wall_s": time.time() - t0, "load_avg": os.getloadavg()[0],
            "t_unix": time.time()}


def measure(threads: int, directory: Path, data: dict) -> dict:
    """Bench the extra shapes, each between two runs of the anchor (the fitting row, stored from a
    quiet machine), so a run beside other jobs can be read against the slowdown they caused."""
    data.setdefault("runs", [])
    data.setdefault("anchors", [])
    anchor = SV.fixture(FIT_ROW[0], FIT_ROW[1], directory)
    done = {(r["key"], r["depth"]) for r in data["runs"]}
    for key, _, _, ft in EXTRA_SHAPES:
        for depth in SV.CPU_DEPTHS:
            if (key, depth) in done:
                continue
            before = _bench(anchor, FIT_ROW[2], threads)
            rec = {"key": key, "ftype": ft, "set": "validate", **_bench(fixture(key, ft, directory), depth, threads)}
            after = _bench(anchor, FIT_ROW[2], threads)
            rec["anchor"] = {k: (before[k] + after[k]) / 2 for k in ("prefill_tok_s", "decode_tok_s", "load_avg")}
            data["runs"].append(rec)
            data["anchors"] += [before, after]
            EXTRA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            print(f"# measured {key} depth {depth}: {rec['wall_s']:.0f} s, load {rec['load_avg']:.2f}; anchor "
                  f"{rec['anchor']['prefill_tok_s']:.1f} / {rec['anchor']['decode_tok_s']:.2f} tok/s", flush=True)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the efficiency on the fitting row and print it")
    ap.add_argument("--measure", action="store_true", help="bench the extra MoE shapes missing from moe_cpu_runs.json")
    ap.add_argument("--models-dir", default=None, help="where the sparse fixtures are written (default: a temp dir)")
    args = ap.parse_args(argv)
    directory = Path(args.models_dir or tempfile.mkdtemp(prefix="kvtuner-moe-"))
    directory.mkdir(parents=True, exist_ok=True)
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    probe = stored["probe"]
    rows = [r for r in stored["runs"] if r["key"] in MOE_KEYS]
    for r in rows:
        r["set"] = "fit" if (r["key"], r["ftype"], r["depth"]) == FIT_ROW else "validate"
    extra = json.loads(EXTRA.read_text(encoding="utf-8")) if EXTRA.exists() else {}
    if args.measure:
        extra = measure(probe["n_threads"], directory, extra)
    rows += extra.get("runs", [])
    if args.fit:
        print(f"host_moe_prefill_efficiency = {fit(rows, probe, directory):.3f}")
        return 0
    print(f"MoE rows on this CPU, cold (the probe of {STORED.name}, no calibration; -p {SV.CPU_PROMPT} -n {SV.CPU_GEN} "
          f"-r 1, {probe['n_threads']} thread)")
    print(f"{'row':34} {'set':8} | {'prefill meas':>12} {'pred':>8} {'ratio':>6} {'err':>7} | "
          f"{'decode meas':>11} {'pred':>7} {'ratio':>6} {'err':>7} | load")
    errs: dict[str, list[float]] = {"fit": [], "validate": []}
    for r in predict(rows, probe, directory):
        rp, rd = r["pred_prefill"] / r["prefill_tok_s"], r["pred_decode"] / r["decode_tok_s"]
        errs[r["set"]] += [abs(rp - 1), abs(rd - 1)]
        print(f"{r['key'] + ' ' + r['ftype'] + ' d' + str(r['depth']):34} {r['set']:8} | {r['prefill_tok_s']:12.1f} "
              f"{r['pred_prefill']:8.1f} {rp:6.3f} {rp - 1:+7.1%} | {r['decode_tok_s']:11.2f} {r['pred_decode']:7.2f} "
              f"{rd:6.3f} {rd - 1:+7.1%} | {r.get('load_avg', float('nan')):.2f}")
    for s, e in errs.items():
        if e:
            print(f"  {s:8} max |error| {max(e):.1%}, rows within 25%: {sum(x <= 0.25 for x in e)}/{len(e)}")
    anchored = [r for r in rows if "anchor" in r]
    if anchored:
        (fit_row,) = [r for r in rows if (r["key"], r["ftype"], r["depth"]) == FIT_ROW and "anchor" not in r]
        print("\nrows measured beside other jobs, read against the anchor (the fitting row benched just before and"
              " after,\nwhose quiet-machine speed is stored): measured x (anchor quiet / anchor now)")
        for r in predict(anchored, probe, directory):
            fp = fit_row["prefill_tok_s"] / r["anchor"]["prefill_tok_s"]
            fd = fit_row["decode_tok_s"] / r["anchor"]["decode_tok_s"]
            mp, md = r["prefill_tok_s"] * fp, r["decode_tok_s"] * fd
            print(f"{r['key'] + ' ' + r['ftype'] + ' d' + str(r['depth']):34} {r['set']:8} | slowdown x{fp:.2f} / "
                  f"x{fd:.2f} | prefill {mp:7.1f} pred {r['pred_prefill']:7.1f} err {r['pred_prefill'] / mp - 1:+7.1%} | "
                  f"decode {md:6.2f} pred {r['pred_decode']:6.2f} err {r['pred_decode'] / md - 1:+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
