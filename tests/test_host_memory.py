"""Host memory as the OS sees it: ggml-cpu's CPU_REPACK copy, mapped vs committed memory, and
the planned host total against the measured peak RSS of a real load."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import gguf
import psutil
import pytest

from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.repack import repack_rows
from kvtuner.core.units import GiB, MiB
from kvtuner.testing.gguf_factory import LLAMA2_7B, ModelSpec, _tensors, write_model

GQT = gguf.GGMLQuantizationType
AVX2 = frozenset({"avx2"})
ARM = frozenset({"neon", "dotprod", "i8mm"})


@pytest.mark.parametrize(
    "t,features,rows",
    [
        (GQT.Q4_0, AVX2, 8),
        (GQT.Q4_K, AVX2, 8),
        (GQT.IQ4_NL, AVX2, 8),
        (GQT.MXFP4, AVX2, 8),
        (GQT.Q6_K, AVX2, 0),
        (GQT.Q8_0, AVX2, 0),
        (GQT.Q5_K, AVX2, 0),
        (GQT.Q2_K, AVX2, 0),
        (GQT.Q2_K, frozenset({"avx2", "avx512"}), 8),
        (GQT.F16, AVX2, 0),
        (GQT.Q4_0, ARM, 4),
        (GQT.Q6_K, ARM, 8),
        (GQT.Q8_0, ARM, 4),
        (GQT.Q4_K, frozenset(), 0),
    ],
)
def test_repack_rules(t, features, rows):
    """ggml/src/ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type, type by type."""
    assert repack_rows(t, features) == rows


def _q4k(spec: ModelSpec) -> ModelSpec:
    rows = [
        (n, s, (GQT.Q4_K if s[0] % 256 == 0 else GQT.Q8_0) if (t != GQT.F32 and len(s) >= 2) else t)
        for n, s, t in _tensors(spec)
    ]
    return dataclasses.replace(spec, tensors=rows, weight_type=GQT.Q4_K)


@pytest.fixture(scope="module")
def llama7b_q4k(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("rss") / "llama2-7b-q4_k.gguf", _q4k(LLAMA2_7B))


def test_repack_planned_for_cpu_only_runs(llama7b_q4k):
    m = ModelProfile.from_gguf(llama7b_q4k)
    host = HostSpec(64 * GiB, 64 * GiB, cpu_features=AVX2)
    plan = plan_memory(m, PlanConfig(n_ctx=4096), host=host)
    # every matrix but token_embd (GET_ROWS) is Q4_K with rows a multiple of 8: repacked
    expected = sum(t.n_bytes for t in m.tensors if t.ggml_type == GQT.Q4_K and t.name != "token_embd.weight")
    h = plan.host
    assert h.repack_bytes == expected
    assert h.mapped_bytes == h.weights_bytes and h.committed_bytes == h.total_bytes - h.weights_bytes
    assert (
        h.total_bytes == h.weights_bytes + expected + h.kv_bytes + h.compute_bytes + h.output_bytes + h.overhead_bytes
    )
    # without mmap the repacked tensors live only in the repack buffer
    nommap = plan_memory(m, PlanConfig(n_ctx=4096, use_mmap=False), host=host).host
    assert nommap.weights_bytes == h.weights_bytes - expected and nommap.mapped_bytes == 0
    # no repack without the instructions, nor with a GPU (its host buffer type comes first)
    assert (
        plan_memory(m, PlanConfig(n_ctx=4096), host=HostSpec(64 * GiB, cpu_features=frozenset())).host.repack_bytes == 0
    )
    gpu = plan_memory(m, PlanConfig(n_ctx=4096, n_gpu_layers=10), [what_if_gpu(8 * GiB)], host)
    assert gpu.host.repack_bytes == 0


def test_swap_advice_names_committed_and_mapped(llama7b_q4k):
    from kvtuner.core.advice.advisor import advise

    m = ModelProfile.from_gguf(llama7b_q4k)
    host = HostSpec(12 * GiB, 10 * GiB, cpu_features=AVX2, mem_bandwidth_bytes_s=20e9)
    plan = plan_memory(m, PlanConfig(n_ctx=4096), host=host)
    msgs = [a.message for a in advise(plan, None)]
    assert any("committed" in x and "mapped" in x for x in msgs), msgs


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
@pytest.mark.skipif(
    psutil.virtual_memory().available < 16 * GiB,
    reason="needs 16 GiB of free RAM: an 8 GiB 7B load whose mapped pages other processes must not evict",
)
def test_bench_peak_rss_within_5_percent_of_the_plan(llama7b_q4k):
    """A real load of LLaMA-2-7B shapes in Q4_K (zero weights): the runner's peak RSS against the
    planned host total (mapped file + CPU_REPACK copy + KV + compute + output + process); one
    full ubatch of prompt touches the whole compute buffer."""
    cmd = [
        sys.executable,
        "-m",
        "kvtuner.cli",
        "bench",
        str(llama7b_q4k),
        "--ctx",
        "2048",
        "-ub",
        "128",
        "-p",
        "128",
        "-n",
        "1",
        "-r",
        "1",
        "-t",
        "2",
        "--no-record",
        "--no-save",
        "--json",
        "--timeout",
        "1200",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    planned, rss = doc["planned_host_total_bytes"], doc["measured_peak_rss_bytes"]
    print(f"planned host total {planned / GiB:.2f} GiB, peak RSS {rss / GiB:.2f} GiB ({rss / planned - 1:+.1%})")
    assert abs(rss / planned - 1) <= 0.05
    rep_planned = doc["planned_devices"]["CPU"]["repack_bytes"]
    rep_measured = doc["measured_devices"]["CPU"].get("repack_bytes", 0)
    assert abs(rep_planned - rep_measured) <= 0.01 * MiB
