"""Host memory as the OS sees it: kvtuner's planned host total vs the measured peak RSS.

Writes zero-weight sparse GGUFs with the published shapes of 7-16B models in Q4_K (the
Q4_K_M bulk; rows whose width is not a multiple of 256 in Q8_0, as llama.cpp's quantizer
falls back), runs ``kvtuner bench`` on each (a real load: the file's zero pages are mapped,
ggml-cpu repacks the Q4_K matrices into CPU_REPACK, KV and compute buffers are allocated and
touched by a prompt of one full ubatch), and prints per model the planned host total (mapped
weights + repacked copy + KV + compute + output + process baseline), the runner's peak RSS, and
the planned and measured CPU_REPACK buffer.

    .venv/bin/python benchmarks/host_rss.py                  # all models (~15-25 min on 2 busy cores)
    .venv/bin/python benchmarks/host_rss.py llama2-7b        # one
    .venv/bin/python benchmarks/host_rss.py --keep DIR       # keep the fixtures in DIR

The planned host total is an upper bound of RSS: compute-buffer pages a graph never uses stay
untouched (a prompt shorter than n_ubatch, or the output rows of a generation step), so the
bench prefills one whole ubatch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import gguf

from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import LLAMA2_7B, LLAMA31_8B, ModelSpec, _tensors, write_model

GQT = gguf.GGMLQuantizationType


def q4k(spec: ModelSpec) -> ModelSpec:
    """``spec`` with its matrices in Q4_K (Q8_0 where a row is not a multiple of 256)."""
    rows = []
    for name, shape, t in _tensors(spec):
        if t != GQT.F32 and len(shape) >= 2:
            t = GQT.Q4_K if shape[0] % 256 == 0 else GQT.Q8_0
        rows.append((name, shape, t))
    return dataclasses.replace(spec, tensors=rows, weight_type=GQT.Q4_K)


MODELS = {
    "llama2-7b": lambda: q4k(LLAMA2_7B),
    "qwen2.5-7b": lambda: q4k(F.qwen2()),
    "llama3.1-8b": lambda: q4k(LLAMA31_8B),
    "deepseek-v2-lite": lambda: q4k(F.deepseek2()),
}


def measure(path: Path, ctx: int, threads: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "kvtuner.cli",
        "bench",
        str(path),
        "--ctx",
        str(ctx),
        "-p",
        "512",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        str(threads),
        "--no-record",
        "--no-save",
        "--json",
        "--timeout",
        "3000",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS), help=f"some of {', '.join(MODELS)}")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", metavar="DIR", default=None, help="write the fixtures here and keep them")
    ap.add_argument("--json", metavar="FILE", default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvtuner-rss-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(
        f"{'model':<18}{'file':>10}{'planned host':>14}{'peak RSS':>11}{'error':>8}{'repack plan':>13}{'measured':>10}"
    )
    for name in args.models:
        path = work / f"{name}-q4_k.gguf"
        try:
            if not path.exists():
                write_model(path, MODELS[name]())
            doc = measure(path, args.ctx, args.threads)
        finally:
            if not args.keep and path.exists():
                path.unlink()
        host = doc["planned_devices"]["CPU"]
        planned, rss = doc["planned_host_total_bytes"], doc["measured_peak_rss_bytes"]
        rep_m = doc["measured_devices"].get("CPU", {}).get("repack_bytes", 0)
        row = {
            "model": name,
            "file_bytes": host["weights_bytes"],
            "planned_host_bytes": planned,
            "peak_rss_bytes": rss,
            "error": rss / planned - 1,
            "repack_planned_bytes": host["repack_bytes"],
            "repack_measured_bytes": rep_m,
        }
        rows.append(row)
        gib = 1 << 30
        print(
            f"{name:<18}{host['weights_bytes'] / gib:>9.2f}G{planned / gib:>13.2f}G{rss / gib:>10.2f}G"
            f"{row['error']:>+8.1%}{host['repack_bytes'] / gib:>12.2f}G{rep_m / gib:>9.2f}G",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
