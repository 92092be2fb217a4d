"""Accuracy of the speed model: predicted vs measured prefill and decode tokens/s.

Runs a matrix of real llama.cpp benches on this machine through the runner
(:func:`kvtuner.runner.bench.run_bench`): the embedded default model (Gemma 3 270M Q4_K_M) and
two larger synthetic llama models with random weights written by gguf's writer
(``kvtuner/testing/gguf_factory.py``): ~300M parameters in F16 (MHA) and Q8_0 (GQA); several depths,
thread counts and KV cache types. It calibrates the speed model on ONE run (the first row,
through :mod:`kvtuner.core.speed.calibration` in a temporary data dir) and prints, per row, the
predicted and measured tokens/s and the error ``predicted / measured - 1``, then the median
absolute error of prefill and decode over the rows not used for calibration (goal <= 15 %).

    .venv/bin/python benchmarks/speed_accuracy.py                 # run the matrix (~6-10 min on 2 cores)
    .venv/bin/python benchmarks/speed_accuracy.py --quick         # 4 rows, default model only
    .venv/bin/python benchmarks/speed_accuracy.py --save runs.json
    .venv/bin/python benchmarks/speed_accuracy.py --load runs.json  # re-evaluate stored measurements

On a machine with a GPU, ``--gpu`` adds partial-offload rows (-ngl half, KV on the host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    model: str  # "default" | "llama-f16-mha" | "llama-q8-gqa"
    n_threads: int
    n_depth: int
    type_kv: str = "f16"
    n_gpu_layers: int = 0
    kv_gpu_layers: int | None = None
    n_prompt: int = 64
    n_gen: int = 16


def matrix(quick: bool, gpu: bool) -> list[Row]:
    if quick:
        return [Row("default", 2, 0), Row("default", 1, 0), Row("default", 2, 1024), Row("default", 2, 1024, "q8_0")]
    rows = [
        Row("default", 2, 0),  # calibration row
        Row("default", 1, 0),
        Row("default", 2, 1024),
        Row("default", 1, 1024),
        Row("default", 2, 1024, "q8_0"),
        Row("llama-f16-mha", 2, 0),
        Row("llama-f16-mha", 1, 0),
        Row("llama-f16-mha", 2, 512),
        Row("llama-f16-mha", 2, 512, "q8_0"),
        Row("llama-f16-mha", 1, 512),
        Row("llama-q8-gqa", 2, 0),
        Row("llama-q8-gqa", 1, 0),
        Row("llama-q8-gqa", 2, 512),
    ]
    if gpu:
        rows += [
            Row("default", 8, 1024, "f16", 10),
            Row("default", 8, 1024, "f16", 19, 9),
            Row("llama-f16-mha", 8, 512, "f16", 8),
            Row("llama-f16-mha", 8, 512, "f16", 17, 8),
        ]
    return rows


def synthetic(name: str, directory: Path) -> Path:
    """Write (once) a ~300M-parameter llama with random weights."""
    import gguf

    from kvtuner.testing.gguf_factory import ModelSpec, write_model

    path = directory / f"{name}.gguf"
    if path.exists():
        return path
    if name == "llama-f16-mha":
        spec = ModelSpec(
            n_layer=16,
            n_embd=1024,
            n_head=16,
            n_head_kv=16,
            n_ff=4096,
            n_vocab=32000,
            n_ctx_train=8192,
            weight_type=gguf.GGMLQuantizationType.F16,
            name="synthetic llama F16 MHA",
        )
    else:
        spec = ModelSpec(
            n_layer=16,
            n_embd=1024,
            n_head=16,
            n_head_kv=4,
            n_ff=4096,
            n_vocab=32000,
            n_ctx_train=8192,
            weight_type=gguf.GGMLQuantizationType.Q8_0,
            name="synthetic llama Q8_0 GQA",
        )
    t = time.time()
    write_model(path, spec, random_weights=True, seed=1)
    print(f"# wrote {path.name}: {path.stat().st_size / 2**20:.0f} MiB in {time.time() - t:.0f} s", flush=True)
    return path


def model_path(name: str, directory: Path) -> Path:
    if name == "default":
        from kvtuner.core.model.default_model import default_model_path

        return default_model_path()
    return synthetic(name, directory)


def config_of(row: Row):
    from kvtuner.core.plan.config import PlanConfig

    n_ctx = max(2048, row.n_depth + row.n_prompt + row.n_gen + 256)
    return PlanConfig(
        n_ctx=n_ctx,
        type_k=row.type_kv,
        type_v=row.type_kv,
        flash_attn="on",
        n_gpu_layers=row.n_gpu_layers,
        kv_gpu_layers=row.kv_gpu_layers,
        n_ubatch=512,
        n_batch=512,
    )


def measure(rows: list[Row], directory: Path, save: str | None = None) -> list[dict]:
    from kvtuner.runner.bench import run_bench

    out: list[dict] = []
    for row in rows:
        path = model_path(row.model, directory)
        t = time.time()
        r = run_bench(
            path,
            config_of(row),
            n_prompt=row.n_prompt,
            n_gen=row.n_gen,
            n_depth=row.n_depth,
            repetitions=2,
            n_threads=row.n_threads,
            timeout_s=600,
        )
        rec = {
            "row": row.__dict__,
            "path": str(path),
            "prefill_tok_s": r.prefill_tok_s.median,
            "decode_tok_s": r.decode_tok_s.median,
            "wall_s": time.time() - t,
            "load_avg": os.getloadavg()[0],
        }
        out.append(rec)
        if save:  # keep what was measured so far
            Path(save).write_text(json.dumps({"host_bw_bytes_s": None, "records": out}, indent=1))
        print(
            f"# measured {row}: prefill {rec['prefill_tok_s']:.1f} decode {rec['decode_tok_s']:.2f} tok/s "
            f"({rec['wall_s']:.0f} s, load {rec['load_avg']:.1f})",
            flush=True,
        )
    return out


def evaluate(records: list[dict], host_bw: float | None, calibrate_on: int = 0) -> tuple[float, float]:
    from kvtuner.core.hardware.specs import GpuSpec, HostSpec
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.calibration import CalibrationStore, calibrated_inputs, measured_run
    from kvtuner.core.speed.measurement import Measurement
    from kvtuner.core.speed.speed_model import decode_tok_s, measure_host_bandwidth, prefill_tok_s, speed_inputs

    bw = host_bw or measure_host_bandwidth()
    host = HostSpec(total_bytes=64 << 30, available_bytes=48 << 30, mem_bandwidth_bytes_s=bw)
    profiles: dict[str, ModelProfile] = {}
    store = CalibrationStore(Path(tempfile.mkdtemp(prefix="kvtuner-cal-")) / "calibration.json")

    def setup(rec):
        row = Row(**rec["row"])
        prof = profiles.setdefault(rec["path"], ModelProfile.from_gguf(rec["path"]))
        gpus = [GpuSpec(**g) for g in rec.get("gpus", [])] if row.n_gpu_layers else []
        plan = plan_memory(prof, config_of(row), gpus, host)
        return row, prof, plan, speed_inputs(gpus, host, n_threads=row.n_threads)

    # calibrate on one record only
    cal_rec = records[calibrate_on]
    row, prof, plan, inp = setup(cal_rec)
    store.add(
        measured_run(
            plan,
            inp,
            Measurement(
                row.n_depth, row.n_prompt, row.n_gen, row.n_threads, cal_rec["prefill_tok_s"], cal_rec["decode_tok_s"]
            ),
            machine="bench",
        )
    )
    print(
        f"host bandwidth {bw / 1e9:.1f} GB/s (numpy copy); calibrated on row {calibrate_on}; "
        "errors = predicted/measured - 1; load = 1-min load average when the row ended"
    )
    hdr = (
        f"{'#':>2} {'model':14} {'thr':>3} {'depth':>5} {'kv':5} {'ngl':>3} {'load':>4} | {'prefill meas':>12} {'pred':>8} "
        f"{'err':>7} | {'decode meas':>11} {'pred':>8} {'err':>7}"
    )
    print(hdr)
    print("-" * len(hdr))
    pre_err, dec_err = [], []
    for i, rec in enumerate(records):
        row, prof, plan, inp = setup(rec)
        cal = calibrated_inputs(inp, prof, store, "bench")
        depth_dec = row.n_depth + row.n_prompt + (row.n_gen - 1) // 2
        p = prefill_tok_s(plan, cal, row.n_prompt, row.n_depth)
        d = decode_tok_s(plan, cal, depth_dec)
        ep, ed = p / rec["prefill_tok_s"] - 1, d / rec["decode_tok_s"] - 1
        if i != calibrate_on:
            pre_err.append(abs(ep))
            dec_err.append(abs(ed))
        print(
            f"{i:>2} {row.model:14} {row.n_threads:>3} {row.n_depth:>5} {row.type_kv:5} {row.n_gpu_layers:>3} "
            f"{rec.get('load_avg', 0):>4.1f} | "
            f"{rec['prefill_tok_s']:>12.1f} {p:>8.1f} {ep:>+7.1%} | {rec['decode_tok_s']:>11.2f} {d:>8.2f} {ed:>+7.1%}"
            + ("   (calibration run)" if i == calibrate_on else "")
        )
    mp, md = statistics.median(pre_err), statistics.median(dec_err)
    print(f"median |error| over {len(pre_err)} rows: prefill {mp:.1%}, decode {md:.1%} (goal <= 15%)")
    return mp, md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 rows on the default model")
    ap.add_argument("--gpu", action="store_true", help="add partial-offload rows (needs a CUDA build and a GPU)")
    ap.add_argument("--models-dir", default=None, help="where the synthetic models are written (default: a temp dir)")
    ap.add_argument("--save", default=None, help="write the measurements to this JSON file")
    ap.add_argument("--load", default=None, help="evaluate stored measurements instead of running")
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="only the rows with these thread counts (e.g. 1 on a busy 2-core machine)",
    )
    ap.add_argument(
        "--calibrate-on", type=int, default=0, metavar="ROW", help="the one row to calibrate on (default 0)"
    )
    args = ap.parse_args(argv)
    if args.load:
        data = json.loads(Path(args.load).read_text())
        evaluate(data["records"], data.get("host_bw_bytes_s"), args.calibrate_on)
        return 0
    from kvtuner.core.speed.speed_model import measure_host_bandwidth

    bw = measure_host_bandwidth()
    directory = Path(args.models_dir or tempfile.mkdtemp(prefix="kvtuner-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    rows = [r for r in matrix(args.quick, args.gpu) if not args.threads or r.n_threads in args.threads]
    records = measure(rows, directory, args.save)
    if args.gpu:
        from kvtuner.core.hardware.nvml import detect_gpus

        gpus = [
            dict(
                name=g.name,
                total_bytes=g.total_bytes,
                free_bytes=g.free_bytes,
                index=g.index,
                mem_bandwidth_bytes_s=g.mem_bandwidth_bytes_s,
                pcie_bandwidth_bytes_s=g.pcie_bandwidth_bytes_s,
            )
            for g in detect_gpus()
        ]
        for r in records:
            r["gpus"] = gpus
    if args.save:
        Path(args.save).write_text(json.dumps({"host_bw_bytes_s": bw, "records": records}, indent=1))
    evaluate(records, bw, args.calibrate_on)
    return 0


if __name__ == "__main__":
    sys.exit(main())
