"""Validation of the speed model against measurements nobody fitted to.

Two groups, each split into a fitting set (rows that were looked at while choosing the model's
structure and constants) and a validation set (predicted once, never tuned on). The split is
fixed here and in benchmarks/speed_public_gpu.json, and was written down before the validation
rows were measured or predicted.

CPU, this machine: zero-weight sparse GGUF files of real architectures (kvtuner/testing/gguf_factory.py
``write_real_shape``: a real model's shapes, tensor types and vocabulary; llama.cpp's kernels
never look at weight values, and MoE files carry real routing data so every token picks its own
experts) run through kvtuner's runner like ``kvtuner bench -p 128 -n 32 -r 1 -d D`` at depths 0
and 2048, against the prediction made *cold*: the CPU probe of this machine (run once here, at the
same thread count), no calibration. Then the same predictions after one calibration bench of the
default model (its depth-0 run).

    fitting set    default model (Gemma 3 270M Q4_K_M), llama-3.2-1b Q8_0, qwen2.5-3b Q4_K_M,
                   granite-3.0-1b-a400m Q4_K_M (MoE)
    validation set llama-2-7b Q4_K_M, llama-3.1-8b Q8_0, gemma-2-9b Q4_K_M, qwen2.5-14b Q4_K_M,
                   phi-3-mini-4k Q8_0, olmoe-1b-7b Q4_K_M (MoE), qwen1.5-moe-a2.7b Q4_K_M (MoE)

GPU, public numbers: the llama-bench rows of benchmarks/speed_public_gpu.json (named GPU, model,
quant, build and source each) against kvtuner's prediction for that catalogue card and a sparse
file of that model shape and quant (full offload, llama-bench's defaults: n_batch 2048, n_ubatch
512, flash attention as the row says; tg of N tokens averaged over depths 0..N-1).

Errors are ``predicted / measured - 1``; each group prints its median |error| and the root mean
square of ``ln(predicted / measured)`` (the 1-sigma band the app shows).

    python benchmarks/speed_validation.py --cpu --save cpu_runs.json   # measure + predict (~30-40 min, 2 cores)
    python benchmarks/speed_validation.py --cpu --load cpu_runs.json   # re-predict stored measurements
    python benchmarks/speed_validation.py --gpu                        # public rows (~1 min)
    python benchmarks/speed_validation.py --gpu --fit-gpu              # refit the GPU constants on the fit rows
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CPU_FIT = [
    ("default", "Q4_K_M"),
    ("llama-3.2-1b", "Q8_0"),
    ("qwen2.5-3b", "Q4_K_M"),
    ("granite-3.0-1b-a400m", "Q4_K_M"),
]
CPU_VALIDATE = [
    ("llama-2-7b", "Q4_K_M"),
    ("llama-3.1-8b", "Q8_0"),
    ("gemma-2-9b", "Q4_K_M"),
    ("qwen2.5-14b", "Q4_K_M"),
    ("phi-3-mini-4k", "Q8_0"),
    ("olmoe-1b-7b", "Q4_K_M"),
    ("qwen1.5-moe-a2.7b", "Q4_K_M"),
]
CPU_DEPTHS = (0, 2048)
CPU_PROMPT, CPU_GEN = 128, 32
PUBLIC = ROOT / "benchmarks" / "speed_public_gpu.json"
#: Version of the probe a stored measurement file holds (a newer probe measures again).
PROBE_VERSION = 3


def fixture(key: str, ftype: str, directory: Path) -> Path:
    """The model file of a row: the embedded default model, or a sparse real-shape file (written once)."""
    if key == "default":
        from kvtuner.core.model.default_model import default_model_path

        return default_model_path()
    from kvtuner.testing.gguf_factory import write_real_shape

    path = directory / f"{key}-{ftype}.gguf"
    if not path.exists():
        write_real_shape(path, key, ftype)
    return path


def cpu_config(depth: int):
    from kvtuner.core.plan.config import PlanConfig

    return PlanConfig(
        n_ctx=4096 if depth + CPU_PROMPT + CPU_GEN <= 4096 - 256 else 8192,
        flash_attn="on",
        n_gpu_layers=0,
        n_batch=512,
        n_ubatch=512,
    )


# ------------------------------------------------------------------------------------------
# CPU group


def measure_cpu(
    directory: Path, threads: int, save: Path | None, data: dict, sets: tuple[str, ...], reprobe: bool = False
) -> dict:
    """Probe this machine's CPU, then bench every CPU row of ``sets`` not yet in ``data`` (resumable)."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.speed.cpu_probe import probe_needs
    from kvtuner.runner.bench import run_bench
    from kvtuner.runner.probe import run_cpu_probe

    rows = [(k, f, "fit") for k, f in CPU_FIT] + [(k, f, "validate") for k, f in CPU_VALIDATE]
    if data.get("probe_version") != PROBE_VERSION or reprobe:
        types: set[str] = set()
        dims: set[str] = set()
        for key, ftype, _ in rows:
            t, d = probe_needs(ModelProfile.from_gguf(fixture(key, ftype, directory)))
            types |= set(t)
            dims |= set(d)
        t0 = time.time()
        rates = run_cpu_probe(sorted(types), threads, attn_shapes=sorted(dims))
        data["probe"] = rates.to_dict()
        data["probe_version"] = PROBE_VERSION
        print(
            f"# CPU probe ({', '.join(sorted(types))}; attention {', '.join(sorted(dims))}) at {threads} threads: "
            f"{time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        _save(save, data)
    data.setdefault("runs", [])
    done = {(r["key"], r["ftype"], r["depth"]) for r in data["runs"]}
    for key, ftype, set_ in rows:
        for depth in CPU_DEPTHS:
            if (key, ftype, depth) in done or set_ not in sets:
                continue
            path = fixture(key, ftype, directory)
            t0 = time.time()
            r = run_bench(
                path,
                cpu_config(depth),
                n_prompt=CPU_PROMPT,
                n_gen=CPU_GEN,
                n_depth=depth,
                repetitions=1,
                n_threads=threads,
                timeout_s=3600,
                idle_timeout_s=3600,
            )  # the depth fill is silent
            rec = {
                "key": key,
                "ftype": ftype,
                "set": set_,
                "depth": depth,
                "threads": threads,
                "prefill_tok_s": r.prefill_tok_s.median,
                "decode_tok_s": r.decode_tok_s.median,
                "wall_s": time.time() - t0,
                "load_avg": os.getloadavg()[0],
                "t_unix": time.time(),
            }
            data["runs"].append(rec)
            _save(save, data)
            print(
                f"# measured {key} {ftype} depth {depth} ({set_}): {rec['wall_s']:.0f} s, load {rec['load_avg']:.2f}",
                flush=True,
            )
    return data


def _save(save: Path | None, data: dict) -> None:
    if save is not None:
        save.write_text(json.dumps(data, indent=1) + "\n")


def predict_cpu(data: dict, directory: Path, *, calibrate: bool) -> list[dict]:
    """Predictions for the stored CPU runs (cold, or after one calibration run of the default model)."""
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.calibration import CalibrationStore, calibrated_inputs, measured_run
    from kvtuner.core.speed.cpu_probe import CpuRates
    from kvtuner.core.speed.measurement import Measurement
    from kvtuner.core.speed.speed_model import decode_tok_s, prefill_tok_s, speed_inputs

    rates = CpuRates.from_dict(data["probe"])
    host = HostSpec(total_bytes=64 << 30, available_bytes=48 << 30, mem_bandwidth_bytes_s=20e9)
    store = CalibrationStore(Path(tempfile.mkdtemp(prefix="kvtuner-val-")) / "calibration.json")
    runs = data["runs"]

    def setup(r):
        prof = ModelProfile.from_gguf(fixture(r["key"], r["ftype"], directory))
        plan = plan_memory(prof, cpu_config(r["depth"]), [], host)
        return prof, plan, speed_inputs([], host, n_threads=r["threads"], cpu=rates)

    if calibrate:
        cal = next(r for r in runs if r["key"] == "default" and r["depth"] == 0)
        prof, plan, inp = setup(cal)
        store.add(
            measured_run(
                plan,
                inp,
                Measurement(0, CPU_PROMPT, CPU_GEN, cal["threads"], cal["prefill_tok_s"], cal["decode_tok_s"]),
                machine="val",
            )
        )
    out = []
    for r in runs:
        prof, plan, inp = setup(r)
        if calibrate:
            inp = calibrated_inputs(inp, prof, store, "val")
        dd = r["depth"] + CPU_PROMPT + (CPU_GEN - 1) // 2
        p = prefill_tok_s(plan, inp, CPU_PROMPT, r["depth"])
        d = decode_tok_s(plan, inp, dd)
        out.append({**r, "pred_prefill": p, "pred_decode": d})
    return out


# ------------------------------------------------------------------------------------------
# GPU group


def gpu_rows(directory: Path, constants=None) -> list[dict]:
    """Predictions for the public rows (``constants``: SpeedConstants to use, default the model's)."""
    from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import ALL_LAYERS, PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.speed_model import (
        SpeedConstants,
        decode_workload,
        prefill_tok_s,
        speed_inputs,
        workload_time_s,
    )

    doc = json.loads(PUBLIC.read_text())
    host = HostSpec(total_bytes=128 << 30, available_bytes=96 << 30, mem_bandwidth_bytes_s=40e9)
    out = []
    for r in doc["rows"]:
        prof = ModelProfile.from_gguf(fixture(r["model"], r["ftype"], directory))
        gpu = catalogue_gpu(r["gpu"])
        cfg = PlanConfig(
            n_ctx=1024,
            n_gpu_layers=ALL_LAYERS,
            flash_attn="on" if r["flash_attn"] else "off",
            n_batch=2048,
            n_ubatch=512,
            kv_gpu_layers=0 if r["no_kv_offload"] else None,
        )
        plan = plan_memory(prof, cfg, [gpu], host)
        inp = speed_inputs([gpu], host, n_threads=8, constants=constants or SpeedConstants(), measure=False)
        pp = prefill_tok_s(plan, inp, 512, 0)
        n = r["tg_tokens"]
        tg = n / sum(workload_time_s(decode_workload(plan, d), inp) for d in range(n))
        out.append({**r, "pred_prefill": pp, "pred_decode": tg})
    return out


def fit_gpu(directory: Path) -> None:
    """Least squares in log space over the fit rows for the GPU constants (prints them)."""
    from kvtuner.core.speed.speed_model import SpeedConstants

    names = (
        "gpu_bw_efficiency",
        "gpu_token_overhead_s",
        "gpu_layer_overhead_s",
        "gpu_int8_efficiency",
        "gpu_fp16_efficiency",
        "crossing_latency_s",
    )
    x = dict.fromkeys(names, 0.0)
    base = SpeedConstants()

    def loss(xs):
        c = base.scaled(**{k: math.exp(v) for k, v in xs.items()})
        err = 0.0
        for r in gpu_rows(directory, c):
            if r["set"] != "fit":
                continue
            if r["tg"]:
                err += math.log(r["pred_decode"] / r["tg"]) ** 2
            if r["pp512"] and not r["no_kv_offload"]:  # see the row's note: an older -nkvo prefill path
                err += math.log(r["pred_prefill"] / r["pp512"]) ** 2
        return err + 0.001 * sum(v * v for v in xs.values())

    best = loss(x)
    for step in (1.0, 0.3, 0.1, 0.03, 0.01):
        improved = True
        while improved:
            improved = False
            for n in names:
                for sgn in (1, -1):
                    t = dict(x)
                    t[n] += sgn * step
                    v = loss(t)
                    if v < best - 1e-12:
                        x, best, improved = t, v, True
    c = base.scaled(**{k: math.exp(v) for k, v in x.items()})
    print(f"fitted on the fit rows (loss {best:.4f}):")
    for n in names:
        print(f"  {n} = {getattr(c, n):.4g}")


# ------------------------------------------------------------------------------------------
# report


def _err(pred: float | None, meas: float | None) -> float | None:
    if not pred or not meas:
        return None
    return pred / meas - 1


MARKDOWN = False


def _md_table(title: str, rows: list[dict], meas_pre: str, meas_dec: str, sets: tuple[str, ...]) -> None:
    """The rows as a Markdown table (docs/accuracy/speed.md)."""
    print(f"\n**{title}**\n")
    print("| row | set | prefill measured | predicted | error | decode measured | predicted | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["set"] not in sets:
            continue
        name = r.get("id") or f"{r['key']} {r['ftype']} d{r['depth']}"
        if r.get("gpu"):
            name = f"{r['gpu']}, {r['model']} {r['ftype']} ({r['id']})"
        ep, ed = _err(r["pred_prefill"], r.get(meas_pre)), _err(r["pred_decode"], r.get(meas_dec))
        f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        print(
            f"| {name} | {r['set']} | {f(r.get(meas_pre), '.1f')} | {r['pred_prefill']:.1f} | {f(ep, '+.0%')} | "
            f"{f(r.get(meas_dec), '.2f')} | {r['pred_decode']:.2f} | {f(ed, '+.0%')} |"
        )


def summarise(
    title: str, rows: list[dict], meas_pre: str, meas_dec: str, sets: tuple[str, ...] = ("fit", "validate")
) -> dict:
    """Print the rows and the median |error| and RMS log error per set; returns the figures."""
    if MARKDOWN:
        _md_table(title, rows, meas_pre, meas_dec, sets)
    print(f"\n{title}")
    hdr = f"{'row':<34} {'set':<8} | {'prefill meas':>12} {'pred':>9} {'err':>7} | {'decode meas':>11} {'pred':>8} {'err':>7}"
    print(hdr)
    print("-" * len(hdr))
    figures: dict = {}
    for set_ in sets:
        pe, de, pl, dl = [], [], [], []
        for r in rows:
            if r["set"] != set_:
                continue
            ep, ed = _err(r["pred_prefill"], r.get(meas_pre)), _err(r["pred_decode"], r.get(meas_dec))
            name = r.get("id") or f"{r['key']} {r['ftype']} d{r['depth']}"
            fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            print(
                f"{name:<34} {set_:<8} | {fmt(r.get(meas_pre), '12.1f')} {r['pred_prefill']:>9.1f} {fmt(ep, '+7.1%')} | "
                f"{fmt(r.get(meas_dec), '11.2f')} {r['pred_decode']:>8.2f} {fmt(ed, '+7.1%')}"
            )
            if ep is not None:
                pe.append(abs(ep))
                pl.append(math.log(1 + ep))
            if ed is not None:
                de.append(abs(ed))
                dl.append(math.log(1 + ed))
        if pe or de:
            f = {
                "prefill_median": statistics.median(pe) if pe else None,
                "decode_median": statistics.median(de) if de else None,
                "prefill_rms_log": math.sqrt(sum(v * v for v in pl) / len(pl)) if pl else None,
                "decode_rms_log": math.sqrt(sum(v * v for v in dl) / len(dl)) if dl else None,
                "n": max(len(pe), len(de)),
            }
            figures[set_] = f
            print(
                f"  {set_:<8} median |error|: decode {f['decode_median']:.1%}, prefill {f['prefill_median']:.1%} "
                f"(RMS ln error: decode {f['decode_rms_log']:.3f}, prefill {f['prefill_rms_log']:.3f}; {f['n']} rows)"
            )
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU group (measures unless --load)")
    ap.add_argument("--gpu", action="store_true", help="the public GPU group")
    ap.add_argument("--fit-gpu", action="store_true", help="refit the GPU constants on the fit rows and print them")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads for the CPU group (default 2)")
    ap.add_argument("--models-dir", default=None, help="where the sparse fixtures are written (default: a temp dir)")
    ap.add_argument("--save", default=None, help="keep the CPU measurements (and probe) in this JSON file")
    ap.add_argument("--load", default=None, help="predict stored CPU measurements instead of measuring")
    ap.add_argument("--reprobe", action="store_true", help="run the CPU probe again (before measuring)")
    ap.add_argument("--markdown", action="store_true", help="also print the rows as Markdown tables")
    ap.add_argument(
        "--sets",
        default="fit,validate",
        help="which sets to measure and print (default fit,validate; 'fit' while choosing constants)",
    )
    args = ap.parse_args(argv)
    sets = tuple(x for x in args.sets.split(",") if x in ("fit", "validate"))
    global MARKDOWN
    MARKDOWN = args.markdown
    directory = Path(args.models_dir or tempfile.mkdtemp(prefix="kvtuner-fixtures-"))
    directory.mkdir(parents=True, exist_ok=True)
    if args.gpu:
        if args.fit_gpu:
            fit_gpu(directory)
        summarise(
            "GPU, public llama-bench rows (pp512 and tg at depth 0, full offload)",
            gpu_rows(directory),
            "pp512",
            "tg",
            sets,
        )
    if args.cpu:
        if args.load:
            data = json.loads(Path(args.load).read_text())
        else:
            save = Path(args.save) if args.save else None
            data = json.loads(save.read_text()) if save and save.exists() else {}
            data = measure_cpu(directory, args.threads, save, data, sets, args.reprobe)
        print(f"\nCPU probe: {json.dumps({k: v for k, v in data['probe'].items() if k != 'source'})}")
        loads = [r["load_avg"] for r in data["runs"] if r["set"] in sets]
        print(f"load average while measuring: {min(loads):.2f}-{max(loads):.2f}")
        summarise(
            f"CPU, this machine, cold (probe, no calibration; -p {CPU_PROMPT} -n {CPU_GEN} -r 1)",
            predict_cpu(data, directory, calibrate=False),
            "prefill_tok_s",
            "decode_tok_s",
            sets,
        )
        summarise(
            "CPU, after one calibration bench of the default model (its depth-0 run)",
            predict_cpu(data, directory, calibrate=True),
            "prefill_tok_s",
            "decode_tok_s",
            sets,
        )
    if not (args.cpu or args.gpu):
        ap.error("say --cpu, --gpu or both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
