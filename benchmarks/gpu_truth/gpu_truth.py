"""GPU truth: measure what llama.cpp allocates and how fast it runs, next to kvtuner's plan.

Started by ``run.sh`` (which installs the carried wheels and, on a GPU machine,
builds llama-cpp-python with CUDA first); runs here too, on the CPU backend, as the rehearsal.

It talks to kvtuner only through its command line (``python -m kvtuner.cli plan ... --verify
--json``, ``export ... --format llama-server``, ``bench ... --json``, ``inspect --json``) and to
llama.cpp through ``probe.py`` (its own child process, no kvtuner code), and writes its sparse
zero-weight fixtures with the tests' ``gguf_factory``. Phases, each timed:

- ``fixtures``: the zero-weight GGUF files (real shapes: Llama-3.1-8B and Llama-2-7B Q4_K_M,
  Llama-3.1-8B Q8_0, Gemma-3-12B Q4_K_M, Qwen3-30B-A3B Q4_K_M, and the default model Gemma 3
  270M from its real header), a few KiB of disk each but for the MoE files' routing tensors and
  the gpt-oss file's MXFP4 blocks (:func:`routing_data`).
- ``overhead`` (serial, nothing else on the GPU): one probe per configuration reading NVML and
  cudaMemGetInfo at each stage (process start, CUDA context, model, context, after a 512-token
  batch and one token, freed): the real per-process overhead kvtuner assumes to be 400 MiB per GPU
  and 160 MiB on the host.
- ``buffers`` (parallel, ``--jobs``): per configuration ``plan --verify --json`` (kvtuner's plan
  and its own llama.cpp dry run), the same configuration's llama-server command line from
  ``kvtuner export``, and a probe of that command line: a real load (model, KV, compute and
  output buffers per device from llama.cpp's log, graph nodes and splits) or, for configurations
  that only change the context, a no_alloc dry run (compute, output, KV sizes, splits).
- ``speed`` (serial): ``kvtuner bench`` (prefill and decode at depth 0 and 8192) against
  ``kvtuner plan --json``'s predicted speed for the same configuration.

Every measurement may fail alone (its error is recorded and the run goes on); ``--budget-s``
stops starting new ones before the deadline; ``gpu_truth.json`` and ``gpu_truth.md`` are
rewritten after every measurement, so even a killed run leaves its results.

Units: bytes (``*_bytes``), MiB as llama.cpp prints them (``*_mib``, 2 decimals), seconds
(``*_s``), tokens per second (``*_tok_s``). Relative error = (kvtuner - llama.cpp) / llama.cpp.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as _dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MiB = 1 << 20
GiB = 1 << 30
SCHEMA = "kvtuner.gpu_truth/1"

# ------------------------------------------------------------------------------------------------
# configuration matrix


@dataclass(frozen=True)
class Fixture:
    """A model file the run writes. ``kind``: ``factory`` (gguf_factory spec by name and
    transform) or ``default`` (the default model's real header, zero weights)."""

    key: str
    kind: str
    spec: str = ""  # gguf_factory attribute (LLAMA31_8B ...) or a ModelSpec expression
    quant: str = ""  # q4_k_m | q8_0 | "" (the spec's own weight type)
    shape: str = ""  # GQA / MHA / SWA / MoE / default, for the tables
    small: bool = False  # cheap enough for real loads and compute in CPU mode


@dataclass(frozen=True)
class BufferRow:
    """One configuration for the buffer comparison. ``real``: load for real (per-device model and
    KV buffers); else the probe does a no_alloc dry run."""

    key: str
    fixture: str
    flags: tuple[str, ...]
    real: bool = False
    note: str = ""


@dataclass(frozen=True)
class SpeedRow:
    """One ``kvtuner bench``: ``-p n_prompt -n n_gen -d n_depth -r reps`` with ``flags``."""

    key: str
    fixture: str
    flags: tuple[str, ...]
    n_prompt: int = 512
    n_gen: int = 128
    n_depth: int = 0
    reps: int = 2
    threads: int | None = None
    note: str = ""


@dataclass(frozen=True)
class SweepRow:
    """One load of the offload sweep (probe.py's ``bench``): ``flags`` (kvtuner's spelling, also
    given to ``plan`` and ``export``), ``op_offload`` (False: llama.cpp's ``--no-op-offload``,
    which kvtuner's configuration does not carry), a prefill of ``n_prompt`` tokens and ``n_gen``
    decoded tokens at each of ``depths``."""

    key: str
    fixture: str
    flags: tuple[str, ...]
    depths: tuple[int, ...] = (0,)
    op_offload: bool = True
    n_prompt: int = 4096
    n_gen: int = 32
    note: str = ""


@dataclass(frozen=True)
class OverheadRow:
    key: str
    fixture: str
    flags: tuple[str, ...]
    note: str = ""


FIXTURES_GPU = (
    Fixture("llama31-8b-q4km", "factory", "LLAMA31_8B", "q4_k_m", "GQA"),
    Fixture("llama31-8b-q8", "factory", "LLAMA31_8B", "q8_0", "GQA"),
    Fixture("llama2-7b-q4km", "factory", "LLAMA2_7B", "q4_k_m", "MHA"),
    Fixture("gemma3-12b-q4km", "factory", "GEMMA3_12B", "q4_k_m", "SWA"),
    Fixture("qwen3-30b-a3b-q4km", "factory", "QWEN3_30B_A3B", "q4_k_m", "MoE"),
    Fixture("gemma3-270m-zero", "default", shape="default", small=True),
    Fixture("gpt-oss-20b-mxfp4", "factory", "families:gpt_oss", "mxfp4-experts", "MoE"),
)
# CPU rehearsal: the same files plus tiny F16 ones that compute quickly (F16 weights also keep
# llama.cpp's AMX path out of the CPU runs; see README: AMX state is lost on this VM)
TINY_LLAMA = "ModelSpec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=2048, name='tiny llama GQA')"
TINY_GEMMA = (
    "ModelSpec(arch='gemma3', n_layer=6, n_embd=512, n_head=2, n_head_kv=1, head_dim=256, n_ff=1024, "
    "n_vocab=2048, sliding_window=128, swa_pattern=6, tied_output=True, name='tiny gemma3 head 256')"
)
TINY_MOE = (
    "ModelSpec(arch='qwen3moe', n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=2048, "
    "n_expert=8, n_expert_used=2, n_ff_exp=128, name='tiny qwen3moe')"
)
FIXTURES_TINY = (
    Fixture("tiny-llama-f16", "factory", TINY_LLAMA, "", "GQA", small=True),
    Fixture("tiny-moe-f16", "factory", TINY_MOE, "", "MoE", small=True),
    Fixture("tiny-gemma3-f16", "factory", TINY_GEMMA, "", "SWA", small=True),
)

FA_ON = ("-fa", "on")
C8K = ("--ctx", "8192")
C32K = ("--ctx", "32768")


def buffer_rows_full() -> list[BufferRow]:
    """The GPU matrix (also run in CPU mode, where real loads are limited to small models).
    Order = priority (the budget may stop the tail)."""
    L8, L7, G12, MOE, D = (
        "llama31-8b-q4km",
        "llama2-7b-q4km",
        "gemma3-12b-q4km",
        "qwen3-30b-a3b-q4km",
        "gemma3-270m-zero",
    )
    q8 = ("-ctk", "q8_0", "-ctv", "q8_0")
    q4 = ("-ctk", "q4_0", "-ctv", "q4_0")
    return [
        # tier 1 (measured before the first speed rows)
        BufferRow("gqa-full-8k", L8, C8K + FA_ON, True, "full offload"),
        BufferRow("gqa-ngl8-8k", L8, C8K + FA_ON + ("--ngl", "8"), True, "-ngl 8 (output + 7 layers)"),
        BufferRow("gqa-ngl16-8k", L8, C8K + FA_ON + ("--ngl", "16"), True, "-ngl 16"),
        BufferRow("gqa-ngl32-8k", L8, C8K + FA_ON + ("--ngl", "32"), True, "-ngl n_layer: layer 0 stays on the host"),
        BufferRow("gqa-nkvo-8k", L8, C8K + FA_ON + ("--kv-gpu-layers", "0"), True, "-nkvo"),
        BufferRow(
            "gqa-kvsplit8-8k", L8, C8K + FA_ON + ("--kv-gpu-layers", "8"), True, "KV split: 8 layers' KV in VRAM (-ot)"
        ),
        BufferRow(
            "gqa-kvsplit24-8k",
            L8,
            C8K + FA_ON + ("--kv-gpu-layers", "24"),
            True,
            "KV split: 24 layers' KV in VRAM (-ot)",
        ),
        BufferRow("gqa-full-32k", L8, C32K + FA_ON),
        BufferRow("gqa-faoff-8k", L8, C8K + ("-fa", "off")),
        BufferRow("gqa-q8kv-8k", L8, C8K + FA_ON + q8),
        BufferRow("default-q8kv-8k", D, C8K + FA_ON + q8, True, "README example"),
        BufferRow("swa-full-8k", G12, C8K + FA_ON, True),
        BufferRow("moe-full-8k", MOE, C8K + FA_ON, True),
        BufferRow("mha-full-8k", L7, C8K + FA_ON, True),
        # tier 2
        BufferRow("gqa-q4kv-8k", L8, C8K + FA_ON + q4),
        BufferRow("gqa-nkvo-32k", L8, C32K + FA_ON + ("--kv-gpu-layers", "0"), note="-nkvo, long context"),
        BufferRow("default-ngl9-8k", D, C8K + FA_ON + ("--ngl", "9"), True),
        BufferRow("default-nkvo-8k", D, C8K + FA_ON + ("--kv-gpu-layers", "0"), True),
        BufferRow("default-full-32k", D, C32K + FA_ON),
        BufferRow("default-faoff-8k", D, C8K + ("-fa", "off")),
        BufferRow("swa-ngl24-8k", G12, C8K + FA_ON + ("--ngl", "24"), True),
        BufferRow("swa-nkvo-8k", G12, C8K + FA_ON + ("--kv-gpu-layers", "0"), True),
        BufferRow(
            "swa-kvsplit24-8k", G12, C8K + FA_ON + ("--kv-gpu-layers", "24"), True, "KV split (-ot) on an iSWA model"
        ),
        BufferRow("swa-full-32k", G12, C32K + FA_ON),
        BufferRow("swa-faoff-8k", G12, C8K + ("-fa", "off")),
        BufferRow("swa-q8kv-8k", G12, C8K + FA_ON + q8, note="head 256, quantized KV"),
        BufferRow("swa-swafull-8k", G12, C8K + FA_ON + ("--swa-full",)),
        BufferRow("moe-ngl24-8k", MOE, C8K + FA_ON + ("--ngl", "24"), True, "experts of the host layers on the CPU"),
        BufferRow("moe-full-32k", MOE, C32K + FA_ON),
        BufferRow("moe-faoff-8k", MOE, C8K + ("-fa", "off")),
        BufferRow("moe-q8kv-8k", MOE, C8K + FA_ON + q8),
        BufferRow("moe-nkvo-8k", MOE, C8K + FA_ON + ("--kv-gpu-layers", "0")),
        BufferRow("mha-ngl16-8k", L7, C8K + FA_ON + ("--ngl", "16"), True),
        BufferRow("mha-nkvo-8k", L7, C8K + FA_ON + ("--kv-gpu-layers", "0"), True),
        BufferRow("mha-full-32k", L7, C32K + FA_ON),
        BufferRow("mha-faoff-8k", L7, C8K + ("-fa", "off")),
        BufferRow("mha-q8kv-8k", L7, C8K + FA_ON + q8),
        BufferRow("gqa-q8w-full-8k", "llama31-8b-q8", C8K + FA_ON, True, "Q8_0 weights"),
    ]


#: rows of the first tier: buffers[:TIER1_BUFFERS] and speed[:TIER1_SPEED] run before the rest, so a
#: short budget still gets some of each
TIER1_BUFFERS = 14
TIER1_SPEED = 6


def speed_rows_gpu() -> list[SpeedRow]:
    L8, L8Q8, L7, G12, MOE, D = (
        "llama31-8b-q4km",
        "llama31-8b-q8",
        "llama2-7b-q4km",
        "gemma3-12b-q4km",
        "qwen3-30b-a3b-q4km",
        "gemma3-270m-zero",
    )
    c16 = ("--ctx", "16384") + FA_ON
    q8 = ("-ctk", "q8_0", "-ctv", "q8_0")
    return [
        SpeedRow("gqa-q4km-d0", L8, c16),
        SpeedRow("gqa-q4km-d8192", L8, c16, n_depth=8192),
        SpeedRow("gqa-q8w-d0", L8Q8, c16),
        SpeedRow("gqa-q8w-d8192", L8Q8, c16, n_depth=8192),
        SpeedRow("swa-f16kv-d8192", G12, c16, n_depth=8192, note="head 256, f16 KV"),
        SpeedRow("swa-q8kv-d8192", G12, c16 + q8, n_depth=8192, note="head 256, q8_0 KV: the slow path"),
        SpeedRow("swa-q8kv-d0", G12, c16 + q8, note="head 256, q8_0 KV"),
        SpeedRow("moe-d0", MOE, c16),
        SpeedRow("gqa-ngl16-d0", L8, c16 + ("--ngl", "16"), reps=1, note="half the layers on the CPU"),
        SpeedRow("gqa-nkvo-d0", L8, c16 + ("--kv-gpu-layers", "0"), reps=1, note="-nkvo"),
        SpeedRow("mha-d8192", L7, c16, n_depth=8192),
        SpeedRow("gqa-kvsplit16-d0", L8, c16 + ("--kv-gpu-layers", "16"), reps=1, note="KV split (-ot)"),
        SpeedRow("default-d0", D, c16),
    ]


def speed_rows_cpu(quick: bool) -> list[SpeedRow]:
    T, TG = "tiny-llama-f16", "tiny-gemma3-f16"
    c = ("--ctx", "1024") + FA_ON
    rows = [SpeedRow("tiny-d0", T, c, n_prompt=32 if quick else 64, n_gen=8 if quick else 16, reps=1, threads=1)]
    if not quick:
        rows += [
            SpeedRow("tiny-d256", T, c, n_prompt=64, n_gen=16, n_depth=256, reps=1, threads=1),
            SpeedRow(
                "tiny-swa-f16kv-d256", TG, c, n_prompt=64, n_gen=16, n_depth=256, reps=1, threads=1, note="head 256"
            ),
            SpeedRow(
                "tiny-swa-q8kv-d256",
                TG,
                c + ("-ctk", "q8_0", "-ctv", "q8_0"),
                n_prompt=64,
                n_gen=16,
                n_depth=256,
                reps=1,
                threads=1,
                note="head 256, q8_0 KV",
            ),
        ]
    return rows


def sweep_rows_gpu() -> list[SweepRow]:
    """The offload sweep, in priority order (the budget guard cuts the tail): the regimes where the
    model does not fit, forced by flags on the big GPU. Dense Llama-3.1-8B Q4_K_M (32 layers):
    ``-ngl`` 24/16/8, ``-nkvo``, the KV split, op offload off; gpt-oss-20b MXFP4 (24 layers):
    ``--n-cpu-moe`` 8/16/24, ``-ub`` 512/2048/4096 with every expert in RAM, op offload off, a
    partial ``-ngl``; depths 0, 8K and 32K where the regime changes with depth (KV in RAM)."""
    L8, OSS = "llama31-8b-q4km", "gpt-oss-20b-mxfp4"
    c = ("--ctx", "40960") + FA_ON  # 32768 of depth + a 4096-token prompt + the decoded tokens
    d3, d2 = (0, 8192, 32768), (0, 8192)
    return [
        SweepRow("oss-cpumoe24-ub512", OSS, c + ("--n-cpu-moe", "24"), d3, note="every expert in RAM, -ub 512"),
        SweepRow(
            "oss-cpumoe24-ub4096",
            OSS,
            c + ("--n-cpu-moe", "24", "-ub", "4096", "-b", "4096"),
            note="every expert in RAM, -ub 4096",
        ),
        SweepRow("dense-ngl16", L8, c + ("--ngl", "16"), d3, note="half the layers on the CPU"),
        SweepRow("dense-nkvo", L8, c + ("--kv-gpu-layers", "0"), d3, note="-nkvo: all KV in RAM"),
        SweepRow("oss-full", OSS, c, d3, note="full offload (the reference)"),
        SweepRow("dense-full", L8, c, d3, note="full offload (the reference)"),
        SweepRow(
            "oss-cpumoe24-noopoff",
            OSS,
            c + ("--n-cpu-moe", "24"),
            op_offload=False,
            note="every expert in RAM, --no-op-offload: prefill on the CPU",
        ),
        SweepRow(
            "oss-cpumoe24-ub2048",
            OSS,
            c + ("--n-cpu-moe", "24", "-ub", "2048", "-b", "2048"),
            note="every expert in RAM, -ub 2048",
        ),
        SweepRow("oss-cpumoe12", OSS, c + ("--n-cpu-moe", "12"), d2, note="half the layers' experts in RAM"),
        SweepRow("dense-kvsplit16", L8, c + ("--kv-gpu-layers", "16"), d3, note="KV split: 16 of 32 layers' KV in RAM"),
        SweepRow(
            "dense-ngl16-noopoff",
            L8,
            c + ("--ngl", "16"),
            op_offload=False,
            note="half the layers on the CPU, --no-op-offload",
        ),
        SweepRow("dense-ngl24", L8, c + ("--ngl", "24"), d2, note="a quarter of the layers on the CPU"),
        SweepRow("dense-ngl8", L8, c + ("--ngl", "8"), note="three quarters of the layers on the CPU"),
        SweepRow("oss-cpumoe6", OSS, c + ("--n-cpu-moe", "6"), note="a quarter of the layers' experts in RAM"),
        SweepRow("oss-ngl12", OSS, c + ("--ngl", "12"), note="half the layers (attention and experts) on the CPU"),
        SweepRow(
            "dense-nkvo-ub2048",
            L8,
            c + ("--kv-gpu-layers", "0", "-ub", "2048", "-b", "2048"),
            (0, 8192),
            note="-nkvo, -ub 2048",
        ),
    ]


def sweep_rows_cpu(quick: bool) -> list[SweepRow]:
    """The sweep's rehearsal on tiny F16 models (every code path; the CPU backend runs it all
    on the host, so the figures say nothing about a GPU)."""
    T, M = "tiny-llama-f16", "tiny-moe-f16"
    c = ("--ctx", "1024") + FA_ON
    small = {"n_prompt": 64, "n_gen": 4}
    rows = [
        SweepRow("tiny-moe-cpumoe2", M, c + ("--n-cpu-moe", "2"), (0, 256), **small),  # type: ignore[arg-type]
        SweepRow("tiny-ngl2-noopoff", T, c + ("--ngl", "2"), op_offload=False, **small),
    ]  # type: ignore[arg-type]
    if not quick:
        rows += [
            SweepRow("tiny-nkvo", T, c + ("--kv-gpu-layers", "0"), (0, 256), **small),  # type: ignore[arg-type]
            SweepRow("tiny-moe-ub64", M, c + ("--n-cpu-moe", "4", "-ub", "64", "-b", "64"), **small),
        ]  # type: ignore[arg-type]
    return rows


def overhead_rows(mode: str, quick: bool) -> list[OverheadRow]:
    if mode == "gpu":
        return [
            OverheadRow("gqa-full-8k", "llama31-8b-q4km", C8K + FA_ON, "8B full offload"),
            OverheadRow("default-full-8k", "gemma3-270m-zero", C8K + FA_ON, "small model: overhead dominates"),
            OverheadRow("gqa-nkvo-8k", "llama31-8b-q4km", C8K + FA_ON + ("--kv-gpu-layers", "0"), "-nkvo"),
        ]
    rows = [OverheadRow("tiny-full-2k", "tiny-llama-f16", ("--ctx", "2048") + FA_ON, "CPU: host RSS only")]
    return rows


def buffer_rows(mode: str, quick: bool) -> list[BufferRow]:
    if quick:
        return [
            BufferRow("tiny-full-2k", "tiny-llama-f16", ("--ctx", "2048") + FA_ON, True),
            BufferRow("tiny-nkvo-2k", "tiny-llama-f16", ("--ctx", "2048") + FA_ON + ("--kv-gpu-layers", "0")),
            BufferRow("default-q8kv-8k", "gemma3-270m-zero", C8K + FA_ON + ("-ctk", "q8_0", "-ctv", "q8_0"), True),
        ]
    rows = buffer_rows_full()
    if mode == "cpu":
        rows = [BufferRow("tiny-full-2k", "tiny-llama-f16", ("--ctx", "2048") + FA_ON, True)] + rows
    return rows


# ------------------------------------------------------------------------------------------------
# plumbing: budget, commands, environment


class Budget:
    """Wall-clock deadline: nothing new starts after ``deadline``; ``reserve_s`` is kept for writing."""

    def __init__(self, budget_s: float, reserve_s: float = 15.0) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + max(budget_s - reserve_s, 1.0)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class Ctx:
    """Everything the phases share."""

    mode: str
    quick: bool
    budget: Budget
    out: Path
    work: Path
    carry: Path | None
    jobs: int
    python: str
    env: dict[str, str]
    doc: dict[str, Any]
    lock: threading.Lock = field(default_factory=threading.Lock)
    fixtures: dict[str, dict] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)

    def say(self, msg: str) -> None:
        line = f"[{self.budget.elapsed():7.1f}s] {msg}"
        with self.lock:
            self.log_lines.append(line)
        print(line, flush=True)


def run_cmd(ctx: Ctx, argv: list[str], timeout_s: float, *, cwd: Path | None = None) -> dict:
    """Run ``argv``; never raises. Returns rc, stdout, stderr tail, wall_s, timed_out, cmd."""
    t = time.monotonic()
    timeout_s = max(1.0, min(timeout_s, ctx.budget.left() + 10.0))
    rec: dict[str, Any] = {"cmd": shlex.join(argv), "timeout_s": round(timeout_s, 1)}
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=ctx.env, cwd=str(cwd or ctx.work)
        )
        rec.update(rc=p.returncode, stdout=p.stdout, stderr=_tail(p.stderr, 30), timed_out=False)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        rec.update(rc=None, stdout="", stderr=_tail(err, 30), timed_out=True)
    except OSError as exc:
        rec.update(rc=None, stdout="", stderr=str(exc), timed_out=False)
    rec["wall_s"] = round(time.monotonic() - t, 3)
    return rec


def _tail(text: str, n: int) -> str:
    lines = (text or "").splitlines()
    return "\n".join(lines[-n:])


def kvtuner(ctx: Ctx, args: list[str], timeout_s: float = 180.0) -> dict:
    """``python -m kvtuner.cli ARGS``; adds ``json`` when stdout parses as JSON."""
    rec = run_cmd(ctx, [ctx.python, "-m", "kvtuner.cli", *args], timeout_s)
    rec["cmd"] = "kvtuner " + shlex.join(args)
    if rec.get("rc") == 0 and rec.get("stdout", "").lstrip().startswith(("{", "[")):
        try:
            rec["json"] = json.loads(rec["stdout"])
            rec["stdout"] = ""
        except ValueError as exc:
            rec["error"] = f"stdout is not JSON: {exc}"
    elif rec.get("rc") != 0:
        rec["error"] = _first_error(rec)
    return rec


def _first_error(rec: dict) -> str:
    if rec.get("timed_out"):
        return f"timed out after {rec.get('timeout_s')} s"
    lines = [ln for ln in (rec.get("stderr") or "").splitlines() if ln.strip()]
    msg = next((ln for ln in lines if ln.startswith("kvtuner:")), lines[-1] if lines else "no message")
    return f"exit {rec.get('rc')}: {msg}"


# ------------------------------------------------------------------------------------------------
# llama.cpp log parsing (printf formats of the llama.cpp vendored by llama-cpp-python 0.3.36)

_F = r"([0-9]+(?:\.[0-9]+)?)"
RE_MODEL = re.compile(rf"^load_tensors:\s+(\S+) model buffer size =\s*{_F} MiB")  # llama-model.cpp
RE_KVBUF = re.compile(rf"^llama_kv_cache:\s+(\S+) KV buffer size =\s*{_F} MiB")  # llama-kv-cache.cpp
RE_OUT = re.compile(rf"^llama_context:\s+(\S+)\s+output buffer size =\s*{_F} MiB")  # llama-context.cpp
RE_COMPUTE = re.compile(rf"^sched_reserve:\s+(\S+) compute buffer size =\s*{_F} MiB")  # llama-context.cpp
RE_KVSIZE = re.compile(
    rf"^llama_kv_cache: size =\s*{_F} MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
    rf"K \((\w+)\):\s*{_F} MiB, V \((\w+)\):\s*{_F} MiB"
)
RE_GRAPH = re.compile(
    r"graph(?: \(pp bs=(\d+), tg bs=(\d+)\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?"
)
RE_OFFLOADED = re.compile(r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU")
RE_FA = re.compile(r"^llama_context: flash_attn\s+= (\S+)")
RE_GPU_BUFT = re.compile(r"^(CUDA|ROCm|Vulkan|Metal|SYCL|MUSA)\d+$")
#: host weight buffers that hold a second, re-laid-out copy of some weights (llama.cpp's "extra"
#: buffer types: CPU_REPACK, AMX, KleidiAI); kvtuner does not plan them (docs/concepts/where-the-bytes-go.md)
RE_EXTRA_BUFT = re.compile(r"REPACK|AMX|KLEIDI", re.IGNORECASE)


def is_gpu_buft(buft: str) -> bool:
    """A device buffer (``CUDA0``); host buffers are ``CPU``, ``CPU_Mapped``, ``CPU_REPACK``,
    ``AMX``, ``CUDA_Host`` (pinned host memory) ..."""
    return bool(RE_GPU_BUFT.match(buft))


def parse_log(lines: list[list[str]]) -> dict:
    """Buffers per buffer type (MiB as printed), KV caches, graph, offload and FA lines."""
    out: dict[str, Any] = {
        "model_mib": {},
        "kv_mib": {},
        "compute_mib": {},
        "output_mib": {},
        "kv_caches": [],
        "graph": None,
        "offloaded": None,
        "flash_attn": None,
        "errors": [],
        "notable": [],
    }

    def add(table: str, buft: str, mib: str) -> None:
        out[table][buft] = round(out[table].get(buft, 0.0) + float(mib), 2)

    for level, line in lines:
        if level == "error":
            out["errors"].append(line)
        if m := RE_KVSIZE.match(line):
            out["kv_caches"].append(
                {
                    "size_mib": float(m.group(1)),
                    "cells": int(m.group(2)),
                    "layers": int(m.group(3)),
                    "n_seq": int(m.group(4)),
                    "n_stream": int(m.group(5)),
                    "type_k": m.group(6),
                    "k_mib": float(m.group(7)),
                    "type_v": m.group(8),
                    "v_mib": float(m.group(9)),
                }
            )
        elif m := RE_MODEL.match(line):
            add("model_mib", m.group(1), m.group(2))
        elif m := RE_KVBUF.match(line):
            add("kv_mib", m.group(1), m.group(2))
        elif m := RE_OUT.match(line):
            add("output_mib", m.group(1), m.group(2))
        elif m := RE_COMPUTE.match(line):
            add("compute_mib", m.group(1), m.group(2))
        elif (m := RE_GRAPH.search(line)) and line.startswith("sched_reserve"):
            nodes_pp, nodes_tg = int(m.group(3)), int(m.group(4) or m.group(3))
            splits_pp, splits_tg = int(m.group(5)), int(m.group(6) or m.group(5))
            out["graph"] = {"nodes_pp": nodes_pp, "nodes_tg": nodes_tg, "splits_pp": splits_pp, "splits_tg": splits_tg}
        elif m := RE_OFFLOADED.match(line):
            out["offloaded"] = [int(m.group(1)), int(m.group(2))]
        elif m := RE_FA.match(line):
            out["flash_attn"] = m.group(1)
        if level in ("warn", "error") or "repack" in line.lower() or "Flash Attention" in line or "AMX" in line:
            if len(out["notable"]) < 12:
                out["notable"].append(line.strip())
    return out


def by_device(table: dict[str, float]) -> dict[str, float]:
    """``{"gpu": MiB on device buffers, "host": MiB on host buffers}``."""
    gpu = sum(v for k, v in table.items() if is_gpu_buft(k))
    host = sum(v for k, v in table.items() if not is_gpu_buft(k))
    return {"gpu": round(gpu, 2), "host": round(host, 2)}


# ------------------------------------------------------------------------------------------------
# export command line -> probe spec


#: llama.cpp's expert tensor pattern (common/common.h ``LLM_FFN_EXPS_REGEX``).
FFN_EXPS_REGEX = "\\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def probe_spec_from_export(argv_text: str) -> tuple[dict, list[str]]:
    """Translate kvtuner's ``llama-server`` command line into probe.py's spec (llama.cpp's
    model and context parameters). Returns (spec, notes about flags it does not translate)."""
    toks = shlex.split(argv_text.strip())
    spec: dict[str, Any] = {"ctx": {}, "overrides": [], "use_mmap": True}
    c = spec["ctx"]
    notes: list[str] = []
    i = 1
    while i < len(toks):
        t = toks[i]
        val = toks[i + 1] if i + 1 < len(toks) else None
        takes = True
        if t in ("-m", "--model"):
            spec["model"] = val
        elif t in ("-c", "--ctx-size"):
            c["n_ctx"] = int(val)
        elif t in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
            spec["n_gpu_layers"] = -1 if val in ("all", "auto") else int(val)
        elif t in ("-fa", "--flash-attn"):
            c["flash_attn"] = val
        elif t in ("-ctk", "--cache-type-k"):
            c["type_k"] = val
        elif t in ("-ctv", "--cache-type-v"):
            c["type_v"] = val
        elif t in ("-np", "--parallel"):
            c["n_seq_max"] = int(val)
        elif t in ("-b", "--batch-size"):
            c["n_batch"] = int(val)
        elif t in ("-ub", "--ubatch-size"):
            c["n_ubatch"] = int(val)
        elif t in ("-t", "--threads"):
            c["n_threads"] = int(val)
        elif t in ("-ot", "--override-tensor"):
            for item in val.split(","):
                pattern, _, buft = item.rpartition("=")
                spec["overrides"].append([pattern, buft])
        elif t in ("--n-cpu-moe", "-ncmoe"):  # common/arg.cpp llm_add_n_cpu_ffn_overrides with LLM_FFN_EXPS_REGEX
            spec["overrides"] += [[f"blk\\.{il}{FFN_EXPS_REGEX}", "CPU"] for il in range(int(val))]
        elif t == "--fit":
            pass
        elif t in ("-lm",):
            spec["use_mmap"] = val != "none"
        else:
            takes = False
            if t in ("-nkvo", "--no-kv-offload"):
                c["offload_kqv"] = False
            elif t == "--swa-full":
                c["swa_full"] = True
            elif t in ("-cmoe", "--cpu-moe"):
                spec["overrides"].append([FFN_EXPS_REGEX, "CPU"])
            elif t == "--no-op-offload":
                c["op_offload"] = False
            elif t in ("-kvu", "--kv-unified"):
                c["kv_unified"] = True
            elif t == "--no-mmap":
                spec["use_mmap"] = False
            else:
                notes.append(f"export flag not translated: {t}")
        i += 2 if takes else 1
    return spec, notes


# ------------------------------------------------------------------------------------------------
# fixtures


def mxfp4_experts(spec: Any) -> Any:
    """``spec`` with MXFP4 expert tensors and Q8_0 for its other F16 matrices (norms, biases, sinks,
    router stay F32): the type mix of the published gpt-oss GGUF files (llama-bench prints
    "gpt-oss 20B MXFP4 MoE", 11.27 GiB)."""
    import dataclasses

    import gguf

    q = gguf.GGMLQuantizationType
    rows = [
        (n, sh, q.MXFP4 if n.endswith("_exps.weight") else (q.Q8_0 if t == q.F16 else t)) for n, sh, t in spec.tensors
    ]
    return dataclasses.replace(spec, tensors=rows)


def routing_data(gf: Any, path: Path, mxfp4: bool) -> dict[str, Any]:
    """Make a zero-weight MoE file route its tokens to different experts
    (``gguf_factory.write_routing_data``: random token embeddings and routers, unit norms), so that
    the random prompt tokens spread evenly over the experts instead of all taking the same
    ``n_expert_used``: op offload's expert copies, the GPU's grouped expert matmuls and the CPU's
    expert work then follow even routing (a real gpt-oss prompt uses fewer of its experts).
    ``mxfp4`` (a file written with MXFP4 experts): its blocks get a normal scale
    (``write_mxfp4_scales``): once activations are not zero a zero exponent byte is a subnormal
    scale, which sends ggml-cpu's MXFP4 kernels down the CPU's slow path. The MXFP4 tensors are
    then written in full (the file is no longer sparse there)."""
    gf.write_routing_data(path)
    out: dict[str, Any] = {"routing": "random token embeddings and routers, unit norms (write_routing_data)"}
    if mxfp4:
        gf.write_mxfp4_scales(path)
        out["mxfp4_exponent"] = gf.MXFP4_NORMAL_EXPONENT
    return out


def write_fixtures(ctx: Ctx, wanted: set[str]) -> None:
    from kvtuner.testing import gguf_factory as gf  # the tests' generator

    fdir = ctx.work / "fixtures"
    fdir.mkdir(parents=True, exist_ok=True)
    catalogue = {f.key: f for f in FIXTURES_GPU + FIXTURES_TINY}
    for key in sorted(wanted):
        fx = catalogue[key]
        path = fdir / f"{key}.gguf"
        t = time.monotonic()
        rec: dict[str, Any] = {"key": key, "shape": fx.shape, "small": fx.small, "path": str(path)}
        try:
            if fx.kind == "factory" and fx.spec.startswith("families:"):
                from kvtuner.testing import gguf_families as fam

                spec = getattr(fam, fx.spec.split(":", 1)[1])()
                if fx.quant == "mxfp4-experts":  # gpt-oss's published file: MXFP4 experts, Q8_0 elsewhere
                    spec = mxfp4_experts(spec)
                gf.write_model(path, spec)
                rec["source"] = f"kvtuner/testing/gguf_families.py {fx.spec.split(':', 1)[1]}()" + (
                    f" as {fx.quant}" if fx.quant else ""
                )
            elif fx.kind == "factory":
                spec = getattr(gf, fx.spec) if fx.spec.isidentifier() else eval(fx.spec, {"ModelSpec": gf.ModelSpec})
                if fx.quant == "q4_k_m":
                    spec = gf.q4_k_m(spec)
                elif fx.quant == "q8_0":
                    spec = gf.q8_0(spec)
                gf.write_model(path, spec)
                rec["source"] = (
                    f"kvtuner/testing/gguf_factory.py {fx.spec if fx.spec.isidentifier() else spec.name}"
                    + (f" as {fx.quant}" if fx.quant else "")
                )
            else:
                rec.update(_default_fixture(ctx, gf, path))
            if fx.shape == "MoE":
                rec.update(routing_data(gf, path, mxfp4=fx.quant == "mxfp4-experts"))
            rec["file_bytes"] = path.stat().st_size
            rec["disk_bytes"] = path.stat().st_blocks * 512
            ctx.fixtures[key] = rec
            ctx.say(f"fixture {key}: {rec['file_bytes'] / GiB:.2f} GiB file, {rec['disk_bytes'] // 1024} KiB on disk")
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            ctx.say(f"fixture {key}: FAILED {rec['error']}")
        rec["write_s"] = round(time.monotonic() - t, 3)
        ctx.doc["fixtures"].append(rec)

    def inspect(rec: dict) -> None:  # what kvtuner reads from each file
        r = kvtuner(ctx, ["inspect", rec["path"], "--json"], 60)
        j = r.get("json") or {}
        rec["kvtuner_inspect"] = {
            k: j.get(k)
            for k in (
                "name",
                "architecture",
                "file_type",
                "n_params",
                "n_layer",
                "n_embd",
                "n_expert",
                "n_expert_used",
                "n_vocab",
                "file_bytes",
            )
        }
        if r.get("error"):
            rec["kvtuner_inspect"]["error"] = r["error"]

    with cf.ThreadPoolExecutor(max_workers=max(ctx.jobs, 2)) as pool:
        list(pool.map(inspect, [f for f in ctx.doc["fixtures"] if not f.get("error")]))
    # one plan alone first: kvtuner measures the host's memory bandwidth on its first plan and keeps
    # it (calibration store), so the parallel rows after this one do not measure it under load
    small = next((f for f in ctx.doc["fixtures"] if not f.get("error") and f.get("small")), None)
    if small:
        r = kvtuner(ctx, ["plan", small["path"], "--ctx", "2048", "--json"], 120)
        sp = (r.get("json") or {}).get("speed") or {}
        ctx.doc["kvtuner_first_plan"] = {
            "cmd": r["cmd"],
            "wall_s": r["wall_s"],
            "error": r.get("error"),
            "speed_sources": sp.get("sources"),
            "n_threads": sp.get("n_threads"),
        }


def _default_fixture(ctx: Ctx, gf: Any, path: Path) -> dict:
    """The default model's real header + a hole: from the carry folder, else from the local
    install's default model (``kvtuner inspect --json``)."""
    import gzip
    import hashlib

    if ctx.carry and (ctx.carry / "gemma3-270m.header.gguf.gz").is_file():
        meta = json.loads((ctx.carry / "gemma3-270m.header.json").read_text())
        head = gzip.decompress((ctx.carry / "gemma3-270m.header.gguf.gz").read_bytes())
        if hashlib.sha256(head).hexdigest() != meta["header_sha256"]:
            raise ValueError("carried default-model header does not match its sha256")
        gf.write_header_sparse(head, int(meta["file_bytes"]), path)
        return {"source": f"real header of {meta.get('name')} ({meta['header_bytes']} bytes, carried), zero weights"}
    rec = kvtuner(ctx, ["inspect", "--json"], 60)
    if "json" not in rec:
        raise ValueError(f"no carried header and no local default model: {rec.get('error')}")
    gf.copy_header_sparse(rec["json"]["path"], path)
    return {"source": f"real header of {rec['json'].get('name')} (local install), zero weights"}


# ------------------------------------------------------------------------------------------------
# the probe


def run_probe(ctx: Ctx, key: str, spec: dict, timeout_s: float) -> dict:
    """probe.py in a child; returns its result document plus ``parsed`` (parse_log) and the
    child's rc / stderr tail. Never raises."""
    pdir = ctx.work / "probes"
    pdir.mkdir(parents=True, exist_ok=True)
    spec_path, res_path = pdir / f"{key}.spec.json", pdir / f"{key}.result.json"
    spec_path.write_text(json.dumps(spec))
    res_path.unlink(missing_ok=True)
    rec = run_cmd(ctx, [ctx.python, str(HERE / "probe.py"), str(spec_path), str(res_path)], timeout_s)
    doc: dict[str, Any] = {}
    if res_path.is_file():
        try:
            doc = json.loads(res_path.read_text())
        except ValueError as exc:
            doc = {"error": f"unreadable probe result: {exc}"}
    doc["rc"], doc["wall_s"], doc["timed_out"] = rec.get("rc"), rec.get("wall_s"), rec.get("timed_out")
    if rec.get("rc") != 0:
        doc["stderr_tail"] = rec.get("stderr")
        if not doc.get("error"):
            doc["error"] = (
                f"probe exited {rec.get('rc')}"
                + (" (timeout)" if rec.get("timed_out") else "")
                + (f" at stage {doc.get('stage')}" if doc.get("stage") else "")
            )
    log = doc.pop("log", [])
    doc["parsed"] = parse_log(log)
    doc["log_tail"] = [f"{lvl}: {text}" for lvl, text in log[-25:]] if not doc.get("ok") else []
    return doc


def _ram_available() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:
        return 8 * GiB


def _gpu_free_bytes() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
    except Exception:
        return None


def _nvml_used_bytes() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:
        return None


# ------------------------------------------------------------------------------------------------
# phase: buffers


def plan_devices(plan: dict) -> dict[str, dict]:
    """kvtuner's per-device figures: ``{"gpu": {...}, "host": {...}}`` (first GPU only)."""
    out: dict[str, dict] = {}
    for d in plan.get("devices", []):
        side = "host" if d.get("kind") == "host" else "gpu"
        if side in out:
            continue
        out[side] = d
    return out


def compare(plan_bytes: float | None, measured_mib: float | None) -> dict:
    """One buffer: kvtuner's bytes vs llama.cpp's MiB; rel error (None when llama.cpp says 0
    and kvtuner not, ``abs_mib`` then tells the miss)."""
    if plan_bytes is None or measured_mib is None:
        return {
            "plan_mib": None if plan_bytes is None else round(plan_bytes / MiB, 2),
            "llama_mib": measured_mib,
            "rel_err": None,
            "abs_mib": None,
        }
    p = plan_bytes / MiB
    d = p - measured_mib
    rel = 0.0 if abs(d) < 0.011 else (d / measured_mib if measured_mib > 0 else None)
    return {
        "plan_mib": round(p, 2),
        "llama_mib": round(measured_mib, 2),
        "rel_err": None if rel is None else round(rel, 4),
        "abs_mib": round(d, 2),
    }


def buffer_comparison(plan: dict, parsed: dict, real: bool) -> dict:
    """The comparison cells of one row (see README for the names)."""
    devs = plan_devices(plan)
    gpu, host = devs.get("gpu", {}), devs.get("host", {})
    est = plan.get("compute_estimate_bytes") or {}
    gpu_name = gpu.get("device")
    comp = by_device(parsed["compute_mib"])
    cuda_host = sum(v for k, v in parsed["compute_mib"].items() if k.endswith("_Host"))
    cpu_compute = round(comp["host"] - cuda_host, 2)
    cells: dict[str, dict] = {}
    if real:
        plain = {k: v for k, v in parsed["model_mib"].items() if not RE_EXTRA_BUFT.search(k)}
        extra = round(sum(v for k, v in parsed["model_mib"].items() if RE_EXTRA_BUFT.search(k)), 2)
        model, kv = by_device(plain), by_device(parsed["kv_mib"])
        if gpu:
            cells["gpu_weights"] = compare(gpu.get("weights_bytes"), model["gpu"])
            cells["gpu_kv"] = compare(gpu.get("kv_bytes"), kv["gpu"])
        cells["host_weights"] = compare(host.get("weights_bytes"), model["host"])
        cells["host_repack"] = compare(0, extra)
        cells["host_kv"] = compare(host.get("kv_bytes"), kv["host"])
    cells["kv_total"] = compare(plan.get("kv_bytes"), round(sum(c["size_mib"] for c in parsed["kv_caches"]), 2))
    if gpu:
        cells["gpu_compute"] = compare(est.get(gpu_name, gpu.get("compute_bytes")), comp["gpu"])
    cells["host_compute"] = compare(est.get(host.get("device", "CPU"), host.get("compute_bytes")), comp["host"])
    out = by_device(parsed["output_mib"])
    cells["output"] = compare(sum(d.get("output_bytes", 0) for d in plan.get("devices", [])), out["gpu"] + out["host"])
    extra = {"llama_cuda_host_compute_mib": round(cuda_host, 2), "llama_cpu_compute_mib": cpu_compute}
    return {"cells": cells, **extra}


def verified_vs_real(plan: dict, parsed: dict) -> dict | None:
    """kvtuner's own dry run (plan --verify) against the probe's numbers, per buffer type."""
    v = plan.get("verified")
    if not v:
        return None
    comp = {k: round(b / MiB, 2) for k, b in (v.get("compute_bytes") or {}).items()}
    outp = {k: round(b / MiB, 2) for k, b in (v.get("output_bytes") or {}).items()}
    same_compute = comp == parsed["compute_mib"]
    same_output = outp == parsed["output_mib"]
    kv = round(v.get("kv_bytes", 0) / MiB, 2)
    kv_llama = round(sum(c["size_mib"] for c in parsed["kv_caches"]), 2)
    return {
        "compute_mib": comp,
        "output_mib": outp,
        "kv_mib": kv,
        "same_compute": same_compute,
        "same_output": same_output,
        "same_kv": abs(kv - kv_llama) <= 0.02,
    }


def measure_buffer_row(ctx: Ctx, row: BufferRow) -> dict:
    fx = ctx.fixtures.get(row.fixture)
    rec: dict[str, Any] = {
        "key": row.key,
        "fixture": row.fixture,
        "flags": list(row.flags),
        "note": row.note,
        "requested_real": row.real,
    }
    if not fx or fx.get("error"):
        rec["error"] = f"fixture {row.fixture} missing"
        return rec
    model = fx["path"]
    t = time.monotonic()
    plan = kvtuner(ctx, ["plan", model, *row.flags, "--verify", "--json"], 180)
    rec["plan_cmd"], rec["plan_s"] = plan["cmd"], plan["wall_s"]
    pj = plan.get("json")
    if pj is None:
        rec["plan_error"] = plan.get("error")
    exp = kvtuner(ctx, ["export", model, *row.flags, "--format", "llama-server"], 60)
    rec["export_cmd"], rec["export_s"] = exp["cmd"], exp["wall_s"]
    if exp.get("rc") == 0 and exp.get("stdout", "").strip():
        rec["llama_server"] = exp["stdout"].strip()
        spec, notes = probe_spec_from_export(rec["llama_server"])
        rec["export_notes"] = notes
    else:
        rec["export_error"] = exp.get("error")
        return _finish(rec, t)
    spec["model"] = model
    real = row.real
    why_dry = None
    if real and ctx.mode == "cpu" and not fx.get("small"):
        real, why_dry = False, "CPU mode: real loads only for small models"
    if real and pj is not None:
        devs = plan_devices(pj)
        host = devs.get("host", {})
        need_host = (host.get("total_bytes") or 0) + (host.get("weights_bytes") or 0)  # a repacked copy may double it
        if need_host > 0.5 * _ram_available():
            real, why_dry = False, f"host would need ~{need_host / GiB:.1f} GiB, over half the available RAM"
        gpu = devs.get("gpu")
        free = _gpu_free_bytes()
        if gpu and free is not None and (gpu.get("total_bytes") or 0) > 0.8 * free / max(ctx.jobs, 1):
            real, why_dry = False, f"GPU would need {gpu['total_bytes'] / GiB:.1f} GiB of {free / GiB:.1f} GiB free"
    rec["real_load"] = real
    if why_dry:
        rec["dry_reason"] = why_dry
    spec["no_alloc"] = not real
    spec["memory"] = True
    if real and (ctx.mode == "gpu" or fx.get("small")) and not (ctx.mode == "cpu" and fx.get("shape") == "default"):
        spec["exercise"] = {"n_prompt": 512, "n_gen": 1}
    spec.setdefault("ctx", {})["n_threads"] = _threads(ctx)
    probe = run_probe(ctx, row.key, spec, 300 if real else 120)
    rec["probe"] = {
        k: probe.get(k)
        for k in (
            "ok",
            "error",
            "stage",
            "rc",
            "wall_s",
            "timings_s",
            "memory",
            "n_vocab",
            "prefill_tokens",
            "log_tail",
            "stderr_tail",
        )
    }
    rec["llama"] = probe.get("parsed")
    if probe.get("llama") and not ctx.doc.get("llama_cpp"):
        ctx.doc["llama_cpp"] = probe["llama"]
    if pj is not None:
        rec["plan"] = _plan_summary(pj)
        rec["compare"] = buffer_comparison(
            pj, probe["parsed"], real and probe.get("stage") not in ("start", "backend_init")
        )
        rec["kvtuner_dry_run"] = verified_vs_real(pj, probe["parsed"])
    if probe.get("error"):
        rec["error"] = f"probe: {probe['error']}"
    return _finish(rec, t)


def _finish(rec: dict, t: float) -> dict:
    rec["wall_s"] = round(time.monotonic() - t, 2)
    return rec


def _threads(ctx: Ctx) -> int:
    n = os.cpu_count() or 2
    if ctx.mode == "cpu":
        return 1
    return max(1, n // max(ctx.jobs, 1))


def _plan_summary(pj: dict) -> dict:
    keep = (
        "config",
        "effective",
        "kv_bytes",
        "weights_bytes",
        "kv_caches",
        "compute_source",
        "compute_estimate_bytes",
        "warnings",
        "verified",
    )
    s = {k: pj.get(k) for k in keep}
    s["devices"] = [
        {
            k: d.get(k)
            for k in (
                "device",
                "kind",
                "name",
                "weights_bytes",
                "kv_bytes",
                "compute_bytes",
                "output_bytes",
                "overhead_bytes",
                "total_bytes",
                "capacity_bytes",
                "free_bytes",
                "n_layers",
                "has_output",
                "weights_mapped",
            )
        }
        for d in pj.get("devices", [])
    ]
    return s


# ------------------------------------------------------------------------------------------------
# phase: overhead


def overhead_result(mem: list[dict], parsed: dict) -> dict:
    """Per stage of a probe: NVML / cudaMemGetInfo used bytes relative to the process start,
    RSS, and ``overhead_bytes_*`` = what the process holds on the GPU beyond llama.cpp's own
    buffers (0 buffers at ``cuda_context``: the bare context)."""
    stages = {m["stage"]: m for m in mem}
    base = stages.get("process_start", {})
    gpu_bufs = (
        sum(
            v
            for t_ in ("model_mib", "kv_mib", "compute_mib", "output_mib")
            for k, v in parsed[t_].items()
            if is_gpu_buft(k)
        )
        * MiB
    )
    host_bufs = (
        sum(v for t_ in ("kv_mib", "compute_mib", "output_mib") for k, v in parsed[t_].items() if not is_gpu_buft(k))
        * MiB
    )
    res: dict[str, Any] = {"gpu_buffers_bytes": int(gpu_bufs), "host_buffers_bytes_excl_weights": int(host_bufs)}
    for name, m in stages.items():
        r: dict[str, Any] = {"rss_bytes": m.get("rss_bytes")}
        if base.get("nvml_used_bytes") is not None and m.get("nvml_used_bytes") is not None:
            r["nvml_used_delta_bytes"] = m["nvml_used_bytes"] - base["nvml_used_bytes"]
        if m.get("cuda_free_bytes") is not None and base.get("nvml_free_bytes") is not None:
            # CUDA's free memory now against NVML's at the start (CUDA cannot look before its context)
            r["cuda_used_delta_bytes"] = base["nvml_free_bytes"] - m["cuda_free_bytes"]
        if m.get("nvml_process_bytes") is not None:
            r["nvml_process_bytes"] = m["nvml_process_bytes"]
        res[name] = r
    # the overhead: what the process holds on the GPU beyond llama.cpp's buffers
    for name in ("cuda_context", "context_created", "after_decode"):
        r = res.get(name)
        if r and r.get("nvml_used_delta_bytes") is not None:
            bufs = 0 if name == "cuda_context" else gpu_bufs
            r["overhead_bytes_nvml"] = int(r["nvml_used_delta_bytes"] - bufs)
            if r.get("cuda_used_delta_bytes") is not None:
                r["overhead_bytes_cuda"] = int(r["cuda_used_delta_bytes"] - bufs)
    return res


def measure_overhead_row(ctx: Ctx, row: OverheadRow) -> dict:
    fx = ctx.fixtures.get(row.fixture)
    rec: dict[str, Any] = {"key": row.key, "fixture": row.fixture, "flags": list(row.flags), "note": row.note}
    if not fx or fx.get("error"):
        rec["error"] = f"fixture {row.fixture} missing"
        return rec
    t = time.monotonic()
    plan = kvtuner(ctx, ["plan", fx["path"], *row.flags, "--json"], 120)
    exp = kvtuner(ctx, ["export", fx["path"], *row.flags, "--format", "llama-server"], 60)
    if exp.get("rc") != 0:
        rec["error"] = f"export: {exp.get('error')}"
        return _finish(rec, t)
    spec, _ = probe_spec_from_export(exp["stdout"])
    spec.update(model=fx["path"], no_alloc=False, memory=True, exercise={"n_prompt": 512, "n_gen": 1})
    spec["ctx"]["n_threads"] = os.cpu_count() if ctx.mode == "gpu" else 1
    probe = run_probe(ctx, "overhead-" + row.key, spec, 300)
    rec["plan_cmd"], rec["llama_server"] = plan["cmd"], exp["stdout"].strip()
    if probe.get("llama") and not ctx.doc.get("llama_cpp"):
        ctx.doc["llama_cpp"] = probe["llama"]
    mem = probe.get("memory") or []
    rec["memory"] = mem
    parsed = probe["parsed"]
    rec["llama"] = parsed
    if probe.get("error"):
        rec["error"] = f"probe: {probe['error']}"
    rec["result"] = overhead_result(mem, parsed)
    pj = plan.get("json")
    if pj:
        devs = plan_devices(pj)
        rec["kvtuner_overhead_bytes"] = {side: d.get("overhead_bytes") for side, d in devs.items()}
        rec["kvtuner_total_bytes"] = {side: d.get("total_bytes") for side, d in devs.items()}
    else:
        rec["plan_error"] = plan.get("error")
    return _finish(rec, t)


# ------------------------------------------------------------------------------------------------
# phase: speed


def predicted_decode_at(speed: dict, depth: float) -> float | None:
    """Linear interpolation of ``plan --json``'s decode curve ``[[depth, tok/s], ...]``."""
    curve = speed.get("curve") or []
    if not curve:
        return None
    if depth <= curve[0][0]:
        return curve[0][1]
    for (d0, v0), (d1, v1) in zip(curve, curve[1:]):
        if d0 <= depth <= d1:
            return v0 + (v1 - v0) * (depth - d0) / max(d1 - d0, 1)
    return curve[-1][1]


def _stat(d: dict | None) -> float | None:
    return None if not d else d.get("median")


def measure_speed_row(ctx: Ctx, row: SpeedRow, plan_rec: dict | None) -> dict:
    fx = ctx.fixtures.get(row.fixture)
    rec: dict[str, Any] = {
        "key": row.key,
        "fixture": row.fixture,
        "flags": list(row.flags),
        "note": row.note,
        "n_prompt": row.n_prompt,
        "n_gen": row.n_gen,
        "n_depth": row.n_depth,
        "reps": row.reps,
    }
    if not fx or fx.get("error"):
        rec["error"] = f"fixture {row.fixture} missing"
        return rec
    t = time.monotonic()
    if plan_rec is None:
        plan_rec = kvtuner(ctx, ["plan", fx["path"], *row.flags, "--json"], 120)
    rec["plan_cmd"] = plan_rec["cmd"]
    pj = plan_rec.get("json")
    args = [
        "bench",
        fx["path"],
        *row.flags,
        "-p",
        str(row.n_prompt),
        "-n",
        str(row.n_gen),
        "-d",
        str(row.n_depth),
        "-r",
        str(row.reps),
        "--json",
        "--no-record",
        "--no-save",
    ]
    if row.threads:
        args += ["-t", str(row.threads)]
    timeout = max(60.0, min(300.0, ctx.budget.left()))
    args += ["--timeout", str(int(timeout))]
    rec["nvml_used_before_bytes"] = _nvml_used_bytes()
    bench = kvtuner(ctx, args, timeout + 30)
    rec["bench_cmd"], rec["bench_s"] = bench["cmd"], bench["wall_s"]
    bj = bench.get("json")
    if bj is None:
        rec["error"] = f"bench: {bench.get('error')}"
        rec["stderr_tail"] = bench.get("stderr")
    else:
        rec["measured"] = {
            "prefill_tok_s": _stat(bj.get("prefill_tok_s")),
            "decode_tok_s": _stat(bj.get("decode_tok_s")),
            "prefill": bj.get("prefill_tok_s"),
            "decode": bj.get("decode_tok_s"),
            "ttft_s": _stat(bj.get("ttft_s")),
            "load_s": bj.get("load_s"),
            "n_threads": bj.get("n_threads"),
            "n_ctx": bj.get("n_ctx"),
            "flash_attn": bj.get("flash_attn"),
            "devices": bj.get("devices"),
            "llama_build": bj.get("llama_build"),
            "peak_vram_used_bytes": bj.get("peak_vram_used_bytes"),
            "peak_vram_process_bytes": bj.get("peak_vram_process_bytes"),
            "peak_rss_bytes": bj.get("peak_rss_bytes"),
            "measured_devices": bj.get("measured_devices"),
            "planned_devices": bj.get("planned_devices"),
            "kv_bytes_match": bj.get("kv_bytes_match"),
            "warnings": bj.get("warnings"),
        }
    if pj:
        sp = pj.get("speed") or {}
        depth_decode = row.n_depth + row.n_prompt + row.n_gen / 2
        rec["predicted"] = {
            "decode_tok_s": predicted_decode_at(sp, depth_decode),
            "decode_depth": depth_decode,
            "prefill_tok_s": sp.get("prefill_tok_s") if row.n_depth == 0 else None,
            "prefill_note": None if row.n_depth == 0 else "plan --json predicts prefill at depth 0 only",
            "band": sp.get("band"),
            "sources": sp.get("sources"),
            "n_threads": sp.get("n_threads"),
            "n_calibration_runs": sp.get("n_calibration_runs"),
        }
        devs = plan_devices(pj)
        if devs.get("gpu"):
            rec["planned_gpu_total_bytes"] = devs["gpu"].get("total_bytes")
        m, p = rec.get("measured") or {}, rec["predicted"]
        for k in ("decode_tok_s", "prefill_tok_s"):
            if m.get(k) and p.get(k):
                rec[f"{k}_ratio"] = round(p[k] / m[k], 3)  # predicted / measured
        peak = (m.get("peak_vram_used_bytes") or {}).get("0")
        if peak is not None and rec.get("nvml_used_before_bytes") is not None and rec.get("planned_gpu_total_bytes"):
            used = peak - rec["nvml_used_before_bytes"]
            rec["vram_used_by_run_bytes"] = used
            rec["vram_plan_rel_err"] = round((rec["planned_gpu_total_bytes"] - used) / used, 4) if used > 0 else None
    else:
        rec["plan_error"] = plan_rec.get("error")
    return _finish(rec, t)


def measure_sweep_row(ctx: Ctx, row: SweepRow) -> dict:
    """One offload-sweep load: kvtuner's prediction (``plan --json --prompt n_prompt``), its
    ``export`` line translated for probe.py, and probe.py's timed prefill and decode at each depth
    in one context. Predicted decode at the mean depth of the decoded tokens; predicted prefill at
    depth 0 (all ``plan`` predicts). A row with op offload off is predicted as kvtuner's
    configuration has it (op offload on), and says so."""
    fx = ctx.fixtures.get(row.fixture)
    rec: dict[str, Any] = {
        "key": row.key,
        "fixture": row.fixture,
        "flags": list(row.flags),
        "note": row.note,
        "op_offload": row.op_offload,
        "n_prompt": row.n_prompt,
        "n_gen": row.n_gen,
        "depths": list(row.depths),
    }
    if not fx or fx.get("error"):
        rec["error"] = f"fixture {row.fixture} missing"
        return rec
    t = time.monotonic()
    threads = str(_threads(ctx))
    plan = kvtuner(ctx, ["plan", fx["path"], *row.flags, "-t", threads, "--prompt", str(row.n_prompt), "--json"], 120)
    rec["plan_cmd"] = plan["cmd"]
    pj = plan.get("json") or {}
    if not pj:
        rec["plan_error"] = plan.get("error")
    exp = kvtuner(ctx, ["export", fx["path"], *row.flags, "--format", "llama-server"], 60)
    rec["export_cmd"] = exp["cmd"]
    if exp.get("rc") != 0 or not exp.get("stdout", "").strip():
        rec["error"] = f"export: {exp.get('error')}"
        return _finish(rec, t)
    rec["llama_server"] = exp["stdout"].strip() + ("" if row.op_offload else " --no-op-offload")
    spec, notes = probe_spec_from_export(rec["llama_server"])
    rec["export_notes"] = notes
    spec["model"] = fx["path"]
    spec["ctx"]["n_threads"] = int(threads)
    spec["ctx"]["op_offload"] = row.op_offload
    spec["bench"] = {"depths": list(row.depths), "n_prompt": row.n_prompt, "n_gen": row.n_gen}
    timeout = max(30.0, min(240.0, ctx.budget.left() - 5))
    res = run_probe(ctx, f"sweep-{row.key}", spec, timeout)
    rec["probe"] = {
        k: res.get(k)
        for k in ("ok", "error", "stage", "timings_s", "wall_s", "timed_out", "stderr_tail", "notes", "log_tail")
    }
    parsed = res.get("parsed") or {}
    rec["llama"] = {
        "graph": parsed.get("graph"),
        "offloaded": parsed.get("offloaded"),
        "model_mib": parsed.get("model_mib"),
        "kv_mib": parsed.get("kv_mib"),
        "compute_mib": parsed.get("compute_mib"),
    }
    sp = pj.get("speed") or {}
    rec["predicted_sources"] = sp.get("sources")
    if not row.op_offload:
        rec["prediction_note"] = "kvtuner's configuration has no --no-op-offload: predicted with op offload on"
    rows = []
    for b in res.get("bench") or []:
        d = int(b.get("depth", 0))
        pred_dec = predicted_decode_at(sp, d + row.n_prompt + row.n_gen / 2) if sp else None
        pred_pre = sp.get("prefill_tok_s") if d == 0 and sp.get("prefill_tokens") == row.n_prompt else None
        one = {
            "depth": d,
            "measured_prefill_tok_s": b.get("prefill_tok_s"),
            "measured_decode_tok_s": b.get("decode_tok_s"),
            "fill_s": b.get("fill_s"),
            "predicted_prefill_tok_s": pred_pre,
            "predicted_decode_tok_s": pred_dec,
            "error": b.get("error"),
        }
        for k in ("prefill", "decode"):
            m, pv = one[f"measured_{k}_tok_s"], one[f"predicted_{k}_tok_s"]
            one[f"{k}_ratio"] = round(pv / m, 3) if m and pv else None  # predicted / measured
        rows.append(one)
    rec["results"] = rows
    if res.get("error") and not rows:
        rec["error"] = f"probe: {res.get('error')}"
    return _finish(rec, t)


# ------------------------------------------------------------------------------------------------
# output


def fmt_cell(c: dict | None) -> str:
    if not c or c.get("llama_mib") is None:
        return "-"
    p, m = c.get("plan_mib"), c.get("llama_mib")
    if c.get("rel_err") is None:
        err = "n/a" if not c.get("abs_mib") else f"{c['abs_mib']:+.1f}M"
    else:
        err = f"{100 * c['rel_err']:+.1f}%"
    return f"{p:.1f} / {m:.1f} ({err})"


def write_outputs(ctx: Ctx, final: bool = False) -> None:
    """Write gpu_truth.json and gpu_truth.md (atomically); called after every measurement."""
    with ctx.lock:
        doc = ctx.doc
        doc["elapsed_s"] = round(ctx.budget.elapsed(), 1)
        doc["final"] = final
        text = json.dumps(doc, indent=1, default=str)
        md = render_md(doc)
        ctx.out.mkdir(parents=True, exist_ok=True)
        for name, data in (("gpu_truth.json", text), ("gpu_truth.md", md)):
            tmp = ctx.out / (name + ".tmp")
            tmp.write_text(data)
            os.replace(tmp, ctx.out / name)


def render_md(doc: dict) -> str:
    L: list[str] = []
    g = doc.get("gpu") or {}
    lc = doc.get("llama_cpp") or {}
    L.append(f"# GPU truth ({doc.get('mode')} mode{', quick' if doc.get('quick') else ''})")
    L.append("")
    L.append(
        f"- created {doc.get('created_utc')}, {doc.get('elapsed_s')} s, {'complete' if doc.get('final') else 'IN PROGRESS / interrupted'}"
    )
    L.append(f"- command: `{doc.get('command')}`")
    L.append(
        f"- GPU: {g.get('name', 'none')} {g.get('memory_total', '')} (driver {g.get('driver', '-')}, "
        f"compute capability {g.get('compute_cap', '-')}); host: {doc.get('host', {}).get('cpu')}, "
        f"{doc.get('host', {}).get('cpus')} CPUs, {doc.get('host', {}).get('ram_gib')} GiB RAM"
    )
    L.append(
        f"- llama-cpp-python {lc.get('version', '?')}, GPU offload {lc.get('gpu_offload')}, devices "
        f"{', '.join(d[0] for d in lc.get('devices', [])) or '?'}"
    )
    L.append(
        "- phases (s): "
        + ", ".join(
            f"{k} {v}" for k, v in {**(doc.get("run_sh_phases_s") or {}), **(doc.get("phases_s") or {})}.items()
        )
    )
    if doc.get("build"):
        b = doc["build"]
        L.append(
            f"- build: {b.get('kind')} for architecture {b.get('arch')} in {b.get('seconds')} s ({b.get('cpu_seconds')} CPU s) with {b.get('jobs')} jobs "
            f"({b.get('nvcc') or 'no nvcc'}); CMAKE_ARGS `{b.get('cmake_args')}`; CFLAGS `{b.get('cflags', '').strip()}`"
        )
    L.append("")
    L.append(
        "Buffers in MiB as `kvtuner / llama.cpp (relative error)`. kvtuner: `plan --json` (compute: its "
        "analytic estimate, `compute_estimate_bytes`); llama.cpp: its log for the same configuration "
        "(kvtuner's llama-server export line, loaded by probe.py): real load where `real` is yes, else a "
        "no_alloc dry run (no model/KV buffer sizes). gpu = CUDA0; host compute = CUDA_Host (pinned) + CPU."
    )
    L.append("")
    L.append(
        "| row | fixture | real | gpu weights | gpu KV | gpu compute | host compute (CUDA_Host + CPU) | host KV | host weights | host repacked copy | KV total | output | splits pp/tg | kvtuner dry run = llama.cpp | error |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in doc.get("buffers", []):
        c = (r.get("compare") or {}).get("cells", {})
        gr = (r.get("llama") or {}).get("graph") or {}
        splits = f"{gr.get('splits_pp')}/{gr.get('splits_tg')}" if gr else "-"
        hc = fmt_cell(c.get("host_compute"))
        cmp_ = r.get("compare") or {}
        if c.get("host_compute") and cmp_.get("llama_cuda_host_compute_mib"):
            hc += f" [{cmp_['llama_cuda_host_compute_mib']:.1f} + {cmp_['llama_cpu_compute_mib']:.1f}]"
        v = r.get("kvtuner_dry_run") or {}
        same = (
            "-"
            if not v
            else (
                "yes"
                if v.get("same_compute") and v.get("same_output") and v.get("same_kv")
                else f"NO (compute {v.get('compute_mib')})"
            )
        )
        err = (r.get("error") or r.get("plan_error") or r.get("export_error") or "").replace("|", "/")[:120]
        L.append(
            f"| {r['key']} | {r['fixture']} | {'yes' if r.get('real_load') else 'no'} | {fmt_cell(c.get('gpu_weights'))} | "
            f"{fmt_cell(c.get('gpu_kv'))} | {fmt_cell(c.get('gpu_compute'))} | {hc} | {fmt_cell(c.get('host_kv'))} | "
            f"{fmt_cell(c.get('host_weights'))} | {fmt_cell(c.get('host_repack'))} | {fmt_cell(c.get('kv_total'))} | {fmt_cell(c.get('output'))} | "
            f"{splits} | {same} | {err} |"
        )
    L.append("")
    L.append("## Per-process overhead (bytes beyond llama.cpp's own buffers)")
    L.append("")
    L.append(
        "NVML device memory used, relative to the probe's start (nothing else on the GPU); cudaMemGetInfo "
        "the same from CUDA's side. kvtuner assumes 400 MiB per GPU and 160 MiB of host process baseline."
    )
    L.append("")
    L.append(
        "| row | CUDA context (NVML / CUDA) | after context: used - buffers | after a 512-token batch + 1 token: used - buffers | freed: left | host RSS at backend init / after decode | kvtuner overhead (gpu / host) | error |"
    )
    L.append("|---|---|---|---|---|---|---|---|")
    for r in doc.get("overhead", []):
        res = r.get("result") or {}

        def mib(v: Any) -> str:
            return "-" if v is None else f"{v / MiB:.1f}"

        cc, cx, ad, fr = (res.get(k, {}) for k in ("cuda_context", "context_created", "after_decode", "model_freed"))
        bi = res.get("backend_init", {})
        ko = r.get("kvtuner_overhead_bytes") or {}
        L.append(
            f"| {r['key']} | {mib(cc.get('overhead_bytes_nvml'))} / {mib(cc.get('overhead_bytes_cuda'))} | "
            f"{mib(cx.get('overhead_bytes_nvml'))} | {mib(ad.get('overhead_bytes_nvml'))} | "
            f"{mib(fr.get('nvml_used_delta_bytes'))} | {mib(bi.get('rss_bytes'))} / {mib(ad.get('rss_bytes'))} | "
            f"{mib(ko.get('gpu'))} / {mib(ko.get('host'))} | {(r.get('error') or '')[:100]} |"
        )
    L.append("")
    L.append("## Speed (tokens/s: kvtuner predicted / measured median)")
    L.append("")
    L.append(
        "Decode is predicted at the mean depth of the measured tokens (depth + prompt + gen/2) from "
        "`plan --json`'s curve; `plan --json` predicts prefill at depth 0 only."
    )
    L.append("")
    L.append(
        "| row | fixture | flags | depth | prefill pred / meas | decode pred / meas | pred/meas (decode) | VRAM used by the run vs plan | error |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|")
    for r in doc.get("speed", []):
        p, m = r.get("predicted") or {}, r.get("measured") or {}

        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.1f}"

        vr = "-"
        if r.get("vram_used_by_run_bytes") is not None:
            vr = f"{r['vram_used_by_run_bytes'] / MiB:.0f} MiB vs {r['planned_gpu_total_bytes'] / MiB:.0f} MiB"
        L.append(
            f"| {r['key']} | {r['fixture']} | `{' '.join(r.get('flags', []))}` | {r.get('n_depth')} | "
            f"{f(p.get('prefill_tok_s'))} / {f(m.get('prefill_tok_s'))} | {f(p.get('decode_tok_s'))} / "
            f"{f(m.get('decode_tok_s'))} | {r.get('decode_tok_s_ratio', '-')} | {vr} | {(r.get('error') or '')[:100]} |"
        )
    L.append("")
    if doc.get("sweep"):
        L.append("## Offload sweep (tokens/s: kvtuner predicted / measured; probe.py's timed prefill and decode)")
        L.append("")
        L.append(
            "| row | flags | op offload | depth | prefill pred / meas (ratio) | decode pred / meas (ratio) | error |"
        )
        L.append("|---|---|---|---|---|---|---|")

        def g(v: Any) -> str:
            return "-" if v is None else f"{v:.1f}"

        for r in doc["sweep"]:
            for x in r.get("results") or [{"depth": "-"}]:
                L.append(
                    f"| {r['key']} | `{' '.join(r.get('flags', []))}` | {'on' if r.get('op_offload', True) else 'off'} | "
                    f"{x.get('depth')} | {g(x.get('predicted_prefill_tok_s'))} / {g(x.get('measured_prefill_tok_s'))} "
                    f"({x.get('prefill_ratio') or '-'}) | {g(x.get('predicted_decode_tok_s'))} / "
                    f"{g(x.get('measured_decode_tok_s'))} ({x.get('decode_ratio') or '-'}) | "
                    f"{(x.get('error') or r.get('error') or '')[:100]} |"
                )
        L.append("")
    if doc.get("skipped"):
        L.append("## Skipped")
        L.append("")
        for s in doc["skipped"]:
            L.append(f"- {s}")
        L.append("")
    if doc.get("errors"):
        L.append("## Errors")
        L.append("")
        for e in doc["errors"]:
            L.append(f"- {e}")
        L.append("")
    L.append("Commands: every row in gpu_truth.json has its `plan_cmd`, `export_cmd` / `llama_server` and `bench_cmd`.")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------
# driver


def environment(ctx: Ctx) -> None:
    host: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}
    try:
        with open("/proc/cpuinfo") as f:
            host["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        host["cpu"] = None
    try:
        import psutil

        host["ram_gib"] = round(psutil.virtual_memory().total / GiB, 1)
    except Exception:
        host["ram_gib"] = None
    ctx.doc["host"] = host
    gpu: dict[str, Any] = {}
    r = run_cmd(
        ctx,
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version,compute_cap,pcie.link.gen.max,pcie.link.width.max",
            "--format=csv,noheader",
        ],
        30,
    )
    if r.get("rc") == 0 and r.get("stdout"):
        parts = [p.strip() for p in r["stdout"].splitlines()[0].split(",")]
        gpu = dict(zip(("name", "memory_total", "driver", "compute_cap", "pcie_gen", "pcie_width"), parts))
    ctx.doc["gpu"] = gpu


def phase(ctx: Ctx, name: str, fn: Callable[[], None]) -> None:
    t = time.monotonic()
    ctx.say(f"== phase {name} (budget left {ctx.budget.left():.0f} s)")
    try:
        fn()
    except Exception as exc:
        ctx.doc["errors"].append(f"phase {name}: {type(exc).__name__}: {exc}")
        ctx.say(f"phase {name} FAILED: {exc}\n{traceback.format_exc()}")
    dt = round(time.monotonic() - t, 1)
    ctx.doc["phases_s"][name] = dt
    ctx.say(f"== phase {name} done in {dt} s")
    write_outputs(ctx)


def run_rows(ctx: Ctx, name: str, rows: list, fn: Callable[[Any], dict], jobs: int, min_left_s: float) -> None:
    """Run ``fn(row)`` for each row (``jobs`` at a time), in order, while the budget allows."""
    results: list[dict | None] = [None] * len(rows)
    earlier = list(ctx.doc.get(name) or [])

    def one(i: int, row: Any) -> None:
        if ctx.budget.left() < min_left_s:
            ctx.doc["skipped"].append(f"{name} {row.key}: budget ({ctx.budget.left():.0f} s left)")
            return
        try:
            rec = fn(row)
        except Exception as exc:  # one row must never stop the others
            rec = {
                "key": row.key,
                "fixture": getattr(row, "fixture", None),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        results[i] = rec
        with ctx.lock:
            ctx.doc[name] = earlier + [r for r in results if r is not None]
        err = rec.get("error")
        ctx.say(f"{name} {row.key}: {'ERROR ' + str(err)[:160] if err else 'ok'} ({rec.get('wall_s', '?')} s)")
        write_outputs(ctx)

    if jobs <= 1:
        for i, row in enumerate(rows):
            one(i, row)
    else:
        with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda a: one(*a), enumerate(rows)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["gpu", "cpu"], required=True)
    ap.add_argument("--quick", action="store_true", help="a handful of rows (the pytest rehearsal)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of this script, seconds")
    ap.add_argument("--out", default=str(ROOT / "gpu_truth_out"))
    ap.add_argument("--work", default="/tmp/gpu_truth")
    ap.add_argument("--carry", default=str(ROOT / ".gpu_truth_carry"))
    ap.add_argument("--jobs", type=int, default=0, help="parallel buffer rows (default: GPU 4, CPU 1)")
    ap.add_argument(
        "--phases",
        default="overhead,buffers,speed",
        help="comma list of overhead, buffers, speed, sweep (the offload sweep; alone it fits a call with the build)",
    )
    ap.add_argument("--command", default="", help="the run.sh command line, recorded in the outputs")
    a = ap.parse_args(argv)
    if a.budget_s <= 0:
        print(f"gpu_truth: --budget-s must be positive, not {a.budget_s}", file=sys.stderr)
        return 2
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for name in ("DATA", "CONFIG", "CACHE"):  # a fresh kvtuner: no calibration, no cached compute figures
        d = work / f"kvtuner_{name.lower()}"
        d.mkdir(exist_ok=True)
        env[f"KVTUNER_{name}_DIR"] = str(d)
    env["KVTUNER_LIBRARY"] = "off"
    env["PYTHONUNBUFFERED"] = "1"
    jobs = a.jobs or (min(4, max(1, (os.cpu_count() or 2) // 4)) if a.mode == "gpu" else 1)
    carry = Path(a.carry) if a.carry and Path(a.carry).is_dir() else None
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": a.mode,
        "quick": a.quick,
        "budget_s": a.budget_s,
        "jobs": jobs,
        "command": a.command or shlex.join(sys.argv),
        "created_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "phases_s": {},
        "fixtures": [],
        "overhead": [],
        "buffers": [],
        "speed": [],
        "sweep": [],
        "skipped": [],
        "errors": [],
    }
    ctx = Ctx(
        mode=a.mode,
        quick=a.quick,
        budget=Budget(a.budget_s),
        out=Path(a.out),
        work=work,
        carry=carry,
        jobs=jobs,
        python=sys.executable,
        env=env,
        doc=doc,
    )
    phases = {p.strip() for p in a.phases.split(",") if p.strip()}
    ctx.say(
        f"gpu_truth {a.mode}{' quick' if a.quick else ''}: budget {a.budget_s:.0f} s, {jobs} parallel rows, "
        f"out {ctx.out}, work {work}"
    )
    environment(ctx)
    try:
        doc["run_sh_phases_s"] = json.loads(os.environ.get("GPU_TRUTH_SHELL_PHASES") or "{}")
    except ValueError:
        doc["run_sh_phases_s"] = {}
    info = os.environ.get("GPU_TRUTH_BUILD_INFO")
    if info and Path(info).is_file():
        try:
            doc["build"] = json.loads(Path(info).read_text())
        except ValueError:
            doc["build"] = {"error": f"unreadable {info}"}
    b_rows = buffer_rows(a.mode, a.quick) if "buffers" in phases else []
    s_rows = (
        (speed_rows_gpu() if a.mode == "gpu" and not a.quick else speed_rows_cpu(a.quick)) if "speed" in phases else []
    )
    o_rows = overhead_rows(a.mode, a.quick) if "overhead" in phases else []
    w_rows = (sweep_rows_gpu() if a.mode == "gpu" else sweep_rows_cpu(a.quick)) if "sweep" in phases else []
    wanted = {r.fixture for r in b_rows + s_rows + o_rows + w_rows}
    phase(ctx, "fixtures", lambda: write_fixtures(ctx, wanted))
    if o_rows:
        phase(ctx, "overhead", lambda: run_rows(ctx, "overhead", o_rows, lambda r: measure_overhead_row(ctx, r), 1, 20))
    plans: dict[str, dict] = {}

    def buffers(rows: list[BufferRow]) -> Callable[[], None]:
        return lambda: run_rows(ctx, "buffers", rows, lambda r: measure_buffer_row(ctx, r), jobs, 10)

    def speed(rows: list[SpeedRow]) -> Callable[[], None]:
        def go() -> None:
            def plan_one(row: SpeedRow) -> None:  # predictions need no quiet machine: in parallel
                fx = ctx.fixtures.get(row.fixture)
                if fx and not fx.get("error") and ctx.budget.left() > 10:
                    plans[row.key] = kvtuner(ctx, ["plan", fx["path"], *row.flags, "--json"], 120)

            with cf.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
                list(pool.map(plan_one, rows))
            run_rows(ctx, "speed", rows, lambda r: measure_speed_row(ctx, r, plans.get(r.key)), 1, 25)

        return go

    tiers = [
        ("buffers_1", b_rows[:TIER1_BUFFERS], buffers),
        ("speed_1", s_rows[:TIER1_SPEED], speed),
        ("buffers_2", b_rows[TIER1_BUFFERS:], buffers),
        ("speed_2", s_rows[TIER1_SPEED:], speed),
    ]
    for name, rows, make in tiers:
        if rows:
            phase(ctx, name, make(rows))
    if w_rows:
        phase(ctx, "sweep", lambda: run_rows(ctx, "sweep", w_rows, lambda r: measure_sweep_row(ctx, r), 1, 25))
    n_err = sum(1 for k in ("overhead", "buffers", "speed", "sweep") for r in doc[k] if r.get("error"))
    doc["summary"] = summarise(doc)
    write_outputs(ctx, final=True)
    ctx.say(
        f"done: {len(doc['buffers'])} buffer rows, {len(doc['overhead'])} overhead rows, {len(doc['speed'])} speed "
        f"rows, {len(doc['sweep'])} sweep rows, {n_err} with errors, {len(doc['skipped'])} skipped; wrote {ctx.out / 'gpu_truth.json'} and .md"
    )
    return 0


def summarise(doc: dict) -> dict:
    """Largest relative error per buffer cell over the rows, and the speed ratios."""
    worst: dict[str, dict] = {}
    for r in doc.get("buffers", []):
        for name, c in ((r.get("compare") or {}).get("cells") or {}).items():
            e = c.get("rel_err")
            if e is None:
                continue
            if name not in worst or abs(e) > abs(worst[name]["rel_err"]):
                worst[name] = {
                    "rel_err": e,
                    "row": r["key"],
                    "plan_mib": c.get("plan_mib"),
                    "llama_mib": c.get("llama_mib"),
                }
    ratios = {r["key"]: r.get("decode_tok_s_ratio") for r in doc.get("speed", []) if r.get("decode_tok_s_ratio")}
    dry_mismatch = [
        r["key"]
        for r in doc.get("buffers", [])
        if r.get("kvtuner_dry_run")
        and not (r["kvtuner_dry_run"].get("same_compute") and r["kvtuner_dry_run"].get("same_kv"))
    ]
    sweep = {
        f"{r['key']}@{x['depth']}": {"decode": x.get("decode_ratio"), "prefill": x.get("prefill_ratio")}
        for r in doc.get("sweep", [])
        for x in r.get("results") or []
        if x.get("decode_ratio") or x.get("prefill_ratio")
    }
    return {
        "worst_rel_err": worst,
        "decode_pred_over_meas": ratios,
        "kvtuner_dry_run_differs": dry_mismatch,
        "sweep_pred_over_meas": sweep,
    }


if __name__ == "__main__":
    sys.exit(main())
