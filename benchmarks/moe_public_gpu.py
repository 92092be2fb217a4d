"""Experts on the CPU with a GPU: kvtuner's decode prediction against public GPU + CPU
measurements. Every row is validation: no constant was fitted to these numbers.

    row                                  source
    gpt-oss-20B MXFP4, --n-cpu-moe 12    llmfit PR #775 (AlexsJones/llmfit, 2026-07-20): RTX 2080 8 GB,
                                         i9-10900X, 62 GB RAM, llama.cpp, ctx 4096, 1 slot: 36.4 tok/s
    DeepSeek-Coder-V2-Lite Q4_K_M,       llmfit PR #778 (same machine and method): 49.6 tok/s
      --n-cpu-moe 16

The model files are sparse fixtures of those shapes (kvtuner/testing/gguf_families.py: gpt-oss-20b with
MXFP4 experts and Q8_0 matrices elsewhere, 11.27 GiB like the published file; DeepSeek-V2-Lite's shapes, which DeepSeek-Coder-V2-Lite shares,
with Q4_K matrices and Q6_K output, an approximation of llama-quantize's Q4_K_M mix). The host is
kvtuner's assumed CPU at 10 threads (speed_model.fallback_cpu_rates: no probe of an i9-10900X
exists here), the GPU the catalogue's RTX 2080 (8 GB, 448 GB/s). The measurements are llmfit's averages of 3 warmed
runs (their generation length is not stated; predicted at depth 256).

    python benchmarks/moe_public_gpu.py [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

ROWS = [
    # key, n_cpu_moe, measured decode tok/s, source
    ("gpt-oss-20b-mxfp4-q8", 12, 36.4, "llmfit PR #775"),
    ("deepseek-v2-lite-q4_k", 16, 49.6, "llmfit PR #778"),
]
THREADS = 10
#: i9-10900X: four channels of DDR4-2933, 93.9 GB/s peak (Intel ARK); the fallback rates take the
#: smaller of this and 5 GB/s per effective thread (29.75 GB/s at 10 threads)
HOST_BANDWIDTH_BYTES_S = 93.9e9


def fixture(key: str, directory: Path) -> Path:
    import gguf

    from kvtuner.testing import gguf_families as F
    from kvtuner.testing.gguf_factory import write_model

    Q = gguf.GGMLQuantizationType
    path = directory / f"{key}.gguf"
    if path.exists():
        return path
    if key == "gpt-oss-20b-mxfp4-q8":
        s = F.gpt_oss()
        # the published file: MXFP4 experts, Q8_0 other matrices (11.27 GiB, as llama-bench prints it)
        rows = [
            (n, sh, Q.MXFP4 if n.endswith("_exps.weight") else (Q.Q8_0 if t == Q.F16 else t)) for n, sh, t in s.tensors
        ]
    else:
        s = F.deepseek2()

        def ty(n, sh, t):
            if t != Q.F16:
                return t
            if sh[0] % 256:  # k-quants need rows of 256: llama-quantize falls back (llama-quant.cpp)
                return Q.Q8_0 if sh[0] % 32 == 0 else t
            if n == "output.weight" or "attn_v_b" in n or "ffn_down" in n:
                return Q.Q6_K  # llama-quantize's Q4_K_M keeps these at Q6_K (use_more_bits layers: approximated)
            return Q.Q4_K

        rows = [(n, sh, ty(n, sh, t)) for n, sh, t in s.tensors]
    return write_model(path, dataclasses.replace(s, tensors=rows))


def main(argv: list[str] | None = None) -> int:
    from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.speed_model import decode_tok_s, fallback_cpu_rates, speed_inputs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args(argv)
    directory = Path(args.models_dir or tempfile.mkdtemp(prefix="kvtuner-moe-gpu-"))
    directory.mkdir(parents=True, exist_ok=True)
    gpus = [catalogue_gpu("RTX 2080")]
    host = HostSpec(total_bytes=62 << 30, available_bytes=60 << 30, mem_bandwidth_bytes_s=HOST_BANDWIDTH_BYTES_S)
    print(f"{'row':44} {'measured':>9} {'predicted':>10} {'ratio':>6} {'err':>7}  VRAM planned   source")
    for key, n, measured, source in ROWS:
        model = ModelProfile.from_gguf(fixture(key, directory))
        plan = plan_memory(model, PlanConfig(n_ctx=4096, flash_attn="on", n_cpu_moe=n), gpus, host)
        inputs = speed_inputs(gpus, host, n_threads=THREADS, cpu=fallback_cpu_rates(THREADS, HOST_BANDWIDTH_BYTES_S))
        pred = decode_tok_s(plan, inputs, 256)
        g = plan.gpus[0]
        print(
            f"{key + f' --n-cpu-moe {n}':44} {measured:9.1f} {pred:10.1f} {pred / measured:6.3f} {pred / measured - 1:+7.1%}"
            f"  {g.total_bytes / (1 << 30):5.2f} GiB   {source}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
