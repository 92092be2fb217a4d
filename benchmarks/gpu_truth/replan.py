"""Re-plan a GPU truth run here, without a GPU: every measured buffer row against today's planner.

The device run (``run.sh``) wrote llama.cpp's per-device buffers for each configuration into a
results JSON. This script writes the same fixtures locally (zero-weight sparse files from
kvtuner/testing/gguf_factory.py, a few KiB on disk), plans each row with kvtuner's Session on a what-if card
of the measured GPU's size, and prints planned vs measured compute buffers (CUDA0 and the host's
CUDA_Host + CPU), GPU weights and KV, with the relative error and medians. Nothing here was fitted
on rows that are marked ``held_out`` below (the second tier of the run).

    .venv/bin/python benchmarks/gpu_truth/replan.py [benchmarks/gpu_truth/results/2026-11-30-h200.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

MiB = 1 << 20
DEFAULT_RESULTS = HERE / "results" / "2026-11-30-h200.json"
#: rows the planner's host-input and GPU-output formulas were read from (tier 1 of the run);
#: the rest (tier 2) were only predicted afterwards
FIT_ROWS = {
    "gqa-full-8k",
    "gqa-full-32k",
    "gqa-faoff-8k",
    "default-q8kv-8k",
    "swa-full-8k",
    "mha-full-8k",
    "moe-full-8k",
    "gqa-ngl8-8k",
    "gqa-ngl16-8k",
    "gqa-ngl32-8k",
    "gqa-nkvo-8k",
    "gqa-kvsplit8-8k",
    "gqa-kvsplit24-8k",
    "gqa-q8kv-8k",
    # the f16 K/V copy term of flash attention was read off these two (tier 2) rows afterwards
    "mha-nkvo-8k",
    "mha-q8kv-8k",
}


def _fixture_path(key: str, work: Path, cache: dict[str, Path]) -> Path:
    if key in cache:
        return cache[key]
    from kvtuner.testing import gguf_factory as gf
    from kvtuner.testing.scripts import load_script

    FIXTURES_GPU = load_script("benchmarks/gpu_truth/gpu_truth.py").FIXTURES_GPU

    fx = {f.key: f for f in FIXTURES_GPU}[key]
    path = work / f"{key}.gguf"
    if fx.kind == "factory":
        spec = getattr(gf, fx.spec)
        spec = gf.q4_k_m(spec) if fx.quant == "q4_k_m" else gf.q8_0(spec) if fx.quant == "q8_0" else spec
        gf.write_model(path, spec)
    else:
        from kvtuner.core.model.default_model import default_model_path

        gf.copy_header_sparse(default_model_path(), path)
    cache[key] = path
    return path


def _err(planned: float, measured: float) -> float | None:
    if not measured:
        return 0.0 if not planned else None
    return (planned - measured) / measured


def replan(results: dict) -> list[dict]:
    """One record per buffer row: planned and measured MiB per buffer, relative errors."""
    from kvtuner.cli import build_parser
    from kvtuner.cli.args import config_from_args
    from kvtuner.core.hardware.specs import GpuSpec, HostSpec
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.session import Session

    gpu_mib = results["gpu"].get("total_mib") or 143771
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        cache: dict[str, Path] = {}
        for row in results["buffers"]:
            if row.get("error") or "llama" not in row:
                continue
            path = _fixture_path(row["fixture"], Path(tmp), cache)
            args = build_parser().parse_args(["plan", str(path), *row["flags"]])
            config = config_from_args(args)
            gpu = GpuSpec(name=results["gpu"].get("name", "GPU"), total_bytes=int(gpu_mib * MiB))
            s = Session(
                model=ModelProfile.from_gguf(path),
                config=config,
                gpus=(gpu,),
                host=HostSpec(total_bytes=128 << 30),
                use_compute_cache=False,
                measure_host_bandwidth=False,
            )
            plan = s.plan()
            llama = row["llama"]
            meas_host_compute = sum(v for k, v in llama["compute_mib"].items() if k != "CUDA0")
            rec = {
                "key": row["key"],
                "split": "fit" if row["key"] in FIT_ROWS else "held_out",
                "compute_gpu": (plan.compute.estimate_on("CUDA0") / MiB, llama["compute_mib"].get("CUDA0", 0.0)),
                "compute_host": (plan.compute.estimate_on("CPU") / MiB, meas_host_compute),
            }
            if row.get("real_load"):  # a dry run (no_alloc) prints no model or KV buffer sizes
                rec["weights_gpu"] = (plan.gpus[0].weights_bytes / MiB, llama.get("model_mib", {}).get("CUDA0", 0.0))
                rec["kv_gpu"] = (plan.gpus[0].kv_bytes / MiB, llama.get("kv_mib", {}).get("CUDA0", 0.0))
            for k in list(rec):
                if isinstance(rec[k], tuple):
                    p, m = rec[k]
                    rec[k] = {"planned_mib": round(p, 2), "measured_mib": round(m, 2), "error": _err(p, m)}
            out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = replan(json.loads(Path(a.results).read_text()))
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        return 0
    kinds = ("compute_gpu", "compute_host", "weights_gpu", "kv_gpu")
    print(f"{'row':20s} {'split':8s} " + " ".join(f"{k:>26s}" for k in kinds))
    for r in rows:
        cells = []
        for k in kinds:
            c = r.get(k)
            cells.append(
                "-".rjust(26)
                if c is None
                else f"{c['planned_mib']:8.2f}/{c['measured_mib']:8.2f} {100 * (c['error'] or 0):+6.1f}%".rjust(26)
            )
        print(f"{r['key']:20s} {r['split']:8s} " + " ".join(cells))
    print("\nmedian |error| (n; share within 2% or 8 MiB; worst under-estimate)")
    for split in ("fit", "held_out"):
        for k in kinds:
            cs = [r[k] for r in rows if r["split"] == split and r.get(k) and r[k]["error"] is not None]
            if not cs:
                continue
            errs = [abs(c["error"]) for c in cs]
            ok = sum(1 for c in cs if abs(c["planned_mib"] - c["measured_mib"]) <= max(0.02 * c["measured_mib"], 8))
            worst = min(c["error"] for c in cs)
            print(
                f"  {split:8s} {k:13s} {100 * statistics.median(errs):5.1f}%  (n={len(cs)}; {ok}/{len(cs)} within; "
                f"worst {100 * worst:+.1f}%)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
