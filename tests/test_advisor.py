"""Advisor rules (kvtuner.core.advice.advisor): one row that must fire and one that must not, per rule,
on real plans of real profiles (the embedded Gemma 3 270M, and sparse synthetic GGUF models
written by kvtuner/testing/gguf_factory.py with the shapes of real models)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest

from kvtuner.core.advice.advisor import Advice, AdvisorError, AdvisorSettings, advise, fix_flags, should_auto_stop
from kvtuner.core.hardware.nvml import GpuProcess
from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.monitor.live import AllocationFailure, LiveState
from kvtuner.core.plan.config import ALL_LAYERS, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.speed_model import SpeedConstants, predict_speed, speed_inputs
from kvtuner.core.units import GiB, MiB
from kvtuner.testing.gguf_factory import LLAMA2_7B, ModelSpec, write_model

# A 2B-class MHA model (32 layers, 2048 wide, 16 heads = 16 KV heads, F16): 256 KiB of KV per token.
MHA_2B = ModelSpec(
    n_layer=32, n_embd=2048, n_head=16, n_head_kv=16, n_ff=5632, n_vocab=32000, n_ctx_train=65536, name="MHA 2B shape"
)
# Llama-2-7B's shape with q8_0-friendly widths, F16: 12.5 GiB of weights, MHA, trained on 4096 tokens.
BIG_HOST = HostSpec(64 * GiB, 48 * GiB, mem_bandwidth_bytes_s=20e9)


@pytest.fixture(scope="session")
def models(tmp_path_factory, default_profile) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("advisor-models")
    return {
        "gemma": default_profile,
        "llama7b": ModelProfile.from_gguf(write_model(d / "llama2-7b.gguf", LLAMA2_7B)),
        "mha2b": ModelProfile.from_gguf(write_model(d / "mha2b.gguf", MHA_2B)),
    }


@dataclass
class Case:
    """One row: model, config, a GPU of ``gpu_gib`` (None: CPU only), host, live state, settings."""

    model: str = "gemma"
    cfg: dict = field(default_factory=dict)
    gpu_gib: float | None = None
    gpu_free_gib: float | None = None
    host: HostSpec = BIG_HOST
    live: LiveState | None = None
    settings: AdvisorSettings | None = None
    speed: bool = True
    n_threads: int = 4


def run_case(models, case: Case) -> tuple[list[Advice], object]:
    gpus = []
    if case.gpu_gib is not None:
        g = what_if_gpu(int(case.gpu_gib * GiB))
        if case.gpu_free_gib is not None:
            g = replace(g, free_bytes=int(case.gpu_free_gib * GiB), what_if=False)
        gpus = [g]
    plan = plan_memory(models[case.model], PlanConfig(**case.cfg), gpus, case.host)
    speed = predict_speed(plan, speed_inputs(gpus, case.host, n_threads=case.n_threads)) if case.speed else None
    return advise(plan, speed, live=case.live, settings=case.settings), plan


def gemma_total_on_gpu(models, **cfg) -> int:
    plan = plan_memory(models["gemma"], PlanConfig(**cfg), [what_if_gpu(12 * GiB)], BIG_HOST)
    return plan.gpus[0].total_bytes


def host_need(models, model="gemma", **cfg) -> int:
    return plan_memory(models[model], PlanConfig(**cfg), [], BIG_HOST).host.total_bytes


# rule id -> (fires, must not fire); Cases given as functions of `models` where they need numbers
CASES: dict[str, list[tuple[str, object, object]]] = {
    "vram-oom": [
        # Llama-2-7B F16 (12.5 GiB of weights) all on a 12 GiB card: over capacity - 1 GiB margin
        ("7b-on-12g", Case("llama7b", {"n_ctx": 4096}, 12), Case("llama7b", {"n_ctx": 4096}, 24)),
        # live: an allocation failure with less free than asked
        (
            "live-alloc",
            Case(
                cfg={"n_ctx": 4096},
                gpu_gib=12,
                live=LiveState(allocation_failure=AllocationFailure("CUDA0", 900 * MiB, 300 * MiB)),
            ),
            Case(cfg={"n_ctx": 4096}, gpu_gib=12, live=LiveState()),
        ),
        # the same failure in a HIP build's log, which names the device ROCm0
        (
            "live-alloc-rocm",
            Case(
                cfg={"n_ctx": 4096},
                gpu_gib=12,
                live=LiveState(allocation_failure=AllocationFailure("ROCm0", 900 * MiB, 300 * MiB)),
            ),
            Case(
                cfg={"n_ctx": 4096},
                gpu_gib=12,
                live=LiveState(allocation_failure=AllocationFailure("CPU", 900 * MiB, 300 * MiB)),
            ),
        ),
    ],
    "ram-oom": [
        (
            "7b-cpu-8g",
            Case("llama7b", {"n_ctx": 4096}, host=HostSpec(8 * GiB, 8 * GiB, mem_bandwidth_bytes_s=20e9)),
            Case("llama7b", {"n_ctx": 4096}, host=HostSpec(32 * GiB, 32 * GiB, mem_bandwidth_bytes_s=20e9)),
        ),
    ],
    "fragmentation-risk": [
        # headroom 256 MiB < max(5 %, 512 MiB); margin 0 so vram-oom stays quiet
        (
            "thin-headroom",
            lambda m: Case(
                cfg={"n_ctx": 8192},
                gpu_gib=(gemma_total_on_gpu(m, n_ctx=8192) + 256 * MiB) / GiB,
                settings=AdvisorSettings(vram_margin_bytes=0),
            ),
            Case(cfg={"n_ctx": 8192}, gpu_gib=12),
        ),
        # live: allocation failed although NVML reported enough free memory
        (
            "live-fragmented",
            Case(
                cfg={"n_ctx": 4096},
                gpu_gib=12,
                live=LiveState(allocation_failure=AllocationFailure("CUDA0", 500 * MiB, 2 * GiB)),
            ),
            Case(
                cfg={"n_ctx": 4096},
                gpu_gib=12,
                live=LiveState(allocation_failure=AllocationFailure("CUDA0", 900 * MiB, 300 * MiB)),
            ),
        ),
    ],
    "swap-risk": [
        # need at 90 % of available RAM (> 80 %), and at 50 %
        (
            "80-percent",
            lambda m: Case(cfg={"n_ctx": 4096}, host=HostSpec(64 * GiB, int(host_need(m, n_ctx=4096) / 0.9))),
            lambda m: Case(cfg={"n_ctx": 4096}, host=HostSpec(64 * GiB, int(host_need(m, n_ctx=4096) / 0.5))),
        ),
        (
            "live-swap-in",
            Case(cfg={"n_ctx": 4096}, live=LiveState(swap_in_bytes_s=20 * MiB)),
            Case(cfg={"n_ctx": 4096}, live=LiveState(swap_in_bytes_s=0.0)),
        ),
        (
            "live-low-available",
            Case(cfg={"n_ctx": 4096}, live=LiveState(total_ram_bytes=16 * GiB, available_ram_bytes=1 * GiB)),
            Case(cfg={"n_ctx": 4096}, live=LiveState(total_ram_bytes=16 * GiB, available_ram_bytes=8 * GiB)),
        ),
        # 12.5 GiB of mapped weights with 10 GiB free (ram-oom fires too): streamed from disk
        (
            "mmap-stream",
            Case("llama7b", {"n_ctx": 4096}, host=HostSpec(16 * GiB, 10 * GiB, mem_bandwidth_bytes_s=20e9)),
            Case(
                "llama7b",
                {"n_ctx": 4096, "use_mmap": False},
                host=HostSpec(16 * GiB, 10 * GiB, mem_bandwidth_bytes_s=20e9),
            ),
        ),
    ],
    "below-abandon-threshold": [
        # 12.5 GiB read per token at 5 GB/s: 0.4 tok/s
        (
            "7b-slow-host",
            Case("llama7b", {"n_ctx": 4096}, host=HostSpec(64 * GiB, 48 * GiB, mem_bandwidth_bytes_s=5e9)),
            Case(cfg={"n_ctx": 4096}),
        ),
        (
            "live-10s",
            Case(cfg={"n_ctx": 4096}, live=LiveState(decode_tok_s=0.6, below_abandon_s=12)),
            Case(cfg={"n_ctx": 4096}, live=LiveState(decode_tok_s=0.6, below_abandon_s=3)),
        ),
    ],
    "v-cache-needs-flash-attn": [
        (
            "q8-v-auto",
            Case(cfg={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "auto"}),
            Case(cfg={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}),
        ),
        (
            "live-fa-off",
            Case(cfg={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}, live=LiveState(flash_attn=False)),
            Case(cfg={"type_k": "q8_0", "type_v": "f16", "flash_attn": "on"}, live=LiveState(flash_attn=False)),
        ),
    ],
    "kv-type-slow-path": [
        # Gemma 3: head size 256 with q8_0 KV on CUDA; the same on the CPU is fine
        (
            "head-256",
            Case(cfg={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}, gpu_gib=12),
            Case(cfg={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}),
        ),
        (
            "k-v-differ",
            Case("mha2b", {"type_k": "q8_0", "type_v": "f16", "flash_attn": "on"}, 24),
            Case("mha2b", {"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}, 24),
        ),
    ],
    "ctx-exceeds-train": [
        ("gemma-64k", Case(cfg={"n_ctx": 65536}), Case(cfg={"n_ctx": 32768})),
    ],
    "first-layer-on-host": [
        ("ngl-n-layer", Case(cfg={"n_gpu_layers": 18}, gpu_gib=12), Case(cfg={"n_gpu_layers": ALL_LAYERS}, gpu_gib=12)),
    ],
    "mha-long-context": [
        ("mha-32k", Case("mha2b", {"n_ctx": 32768}), Case("gemma", {"n_ctx": 32768})),
        ("mha-short", Case("mha2b", {"n_ctx": 65536}), Case("mha2b", {"n_ctx": 8192})),
    ],
    "parallel-multiplies-kv": [
        ("np4", Case(cfg={"n_ctx": 16384, "n_seq": 4}), Case(cfg={"n_ctx": 16384, "n_seq": 4, "kv_unified": True})),
    ],
    "kv-quant-quality": [
        ("q8", Case(cfg={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}), Case(cfg={})),
    ],
    "kv-type-not-applied": [
        (
            "got-f16",
            Case(
                cfg={"type_k": "q4_0", "type_v": "q4_0", "flash_attn": "on"},
                live=LiveState(kv_type_k="f16", kv_type_v="f16"),
            ),
            Case(
                cfg={"type_k": "q4_0", "type_v": "q4_0", "flash_attn": "on"},
                live=LiveState(kv_type_k="q4_0", kv_type_v="q4_0"),
            ),
        ),
    ],
    "other-processes-hold-vram": [
        (
            "nvml-list",
            Case(
                gpu_gib=12,
                live=LiveState(
                    gpu_processes=(
                        GpuProcess(111, "Xorg", 0, 700 * MiB),
                        GpuProcess(222, "kvtuner runner", 0, 2 * GiB),
                    ),
                    own_pids=(222,),
                ),
            ),
            Case(
                gpu_gib=12,
                live=LiveState(gpu_processes=(GpuProcess(222, "kvtuner runner", 0, 2 * GiB),), own_pids=(222,)),
            ),
        ),
        ("nvml-free", Case(gpu_gib=12, gpu_free_gib=9), Case(gpu_gib=12, gpu_free_gib=11.9)),
    ],
    "offload-knee": [
        # MHA 2B at 32K on 24 GiB: 8 GiB of KV; with all KV on the host every token reads it at host speed
        ("nkvo-32k", Case("mha2b", {"n_ctx": 32768, "kv_gpu_layers": 0}, 24), Case("mha2b", {"n_ctx": 32768}, 24)),
    ],
}

ROWS = [(rule, name, fire, quiet) for rule, rows in CASES.items() for name, fire, quiet in rows]


def _case(models, c):
    return c(models) if callable(c) else c


@pytest.mark.parametrize("rule, name, fire, quiet", ROWS, ids=[f"{r}:{n}" for r, n, _, _ in ROWS])
def test_rule_fires_and_stays_quiet(models, rule, name, fire, quiet):
    fired, plan = run_case(models, _case(models, fire))
    hits = [a for a in fired if a.id == rule]
    assert hits, f"{rule} should fire for {name}: got {[a.id for a in fired]}"
    for a in hits:
        assert a.severity in ("error", "warning", "info")
        assert a.message.endswith(".") and a.reason
        assert (a.fix_label != "") == bool(a.fix) or a.fix_label == "Stop the run"
        if a.fix:  # every fix builds a valid configuration
            replace(plan.config, **a.fix)
            assert fix_flags(a.fix).startswith("--") or fix_flags(a.fix).startswith("(")
    quiet_ids = [a.id for a in run_case(models, _case(models, quiet))[0]]
    assert rule not in quiet_ids, f"{rule} must not fire for the quiet case of {name}"


def test_every_rule_has_cases():
    ids = {
        "vram-oom",
        "ram-oom",
        "fragmentation-risk",
        "swap-risk",
        "below-abandon-threshold",
        "v-cache-needs-flash-attn",
        "kv-type-slow-path",
        "ctx-exceeds-train",
        "first-layer-on-host",
        "mha-long-context",
        "parallel-multiplies-kv",
        "kv-quant-quality",
        "kv-type-not-applied",
        "other-processes-hold-vram",
        "offload-knee",
    }
    assert set(CASES) == ids


def test_vram_oom_fix_makes_it_fit(models):
    adv, plan = run_case(models, Case("llama7b", {"n_ctx": 4096}, 12))
    (a,) = [x for x in adv if x.id == "vram-oom"]
    assert a.severity == "error" and "12.00 GiB" in a.message
    fixed = plan_memory(plan.model, replace(plan.config, **a.fix), [what_if_gpu(12 * GiB)], BIG_HOST)
    assert fixed.gpus[0].total_bytes <= 11 * GiB
    assert adv[0].severity == "error"  # errors come first


def test_offload_knee_fix_puts_kv_back(models):
    adv, _ = run_case(models, Case("mha2b", {"n_ctx": 32768, "kv_gpu_layers": 0}, 24))
    (a,) = [x for x in adv if x.id == "offload-knee"]
    assert a.fix.get("kv_gpu_layers", 0) is None or a.fix["kv_gpu_layers"] > 0
    assert "tok/s" in a.message and "%" in a.message


def test_fragmentation_fix_lowers_ubatch(models):
    total = gemma_total_on_gpu(models, n_ctx=8192)
    adv, _ = run_case(
        models,
        Case(cfg={"n_ctx": 8192}, gpu_gib=(total + 256 * MiB) / GiB, settings=AdvisorSettings(vram_margin_bytes=0)),
    )
    (a,) = [x for x in adv if x.id == "fragmentation-risk"]
    assert a.fix == {"n_ubatch": 256} and a.fix_label == "Use n_ubatch 256"


def test_first_layer_fix_and_flags(models):
    """-ngl 18 on an 18-layer model: the output layer is on the GPU, layer 0 is not."""
    adv, _ = run_case(models, Case(cfg={"n_gpu_layers": 18}, gpu_gib=12))
    (a,) = [x for x in adv if x.id == "first-layer-on-host"]
    assert "layer 0" in a.message
    assert a.fix == {"n_gpu_layers": ALL_LAYERS}
    assert fix_flags(a.fix) == "--ngl all"
    assert a.to_dict() == {
        "id": a.id,
        "severity": "warning",
        "message": a.message,
        "reason": a.reason,
        "fix": {"n_gpu_layers": -1},
        "fix_label": "Offload every layer (--ngl all)",
        "trade": [],
    }


def test_fix_flags():
    assert fix_flags({"n_ubatch": 256, "flash_attn": "on"}) == "--ubatch 256 --flash-attn on"
    assert fix_flags({"type_k": "q8_0", "type_v": "q8_0"}) == "--cache-type-k q8_0 --cache-type-v q8_0"
    assert fix_flags({}) == ""
    with pytest.raises(AdvisorError, match="not a configuration field"):
        fix_flags({"bogus": 1})


def test_speed_rules_need_a_speed(models):
    adv, _ = run_case(
        models,
        Case("llama7b", {"n_ctx": 4096}, host=HostSpec(64 * GiB, 48 * GiB, mem_bandwidth_bytes_s=5e9), speed=False),
    )
    assert "below-abandon-threshold" not in [a.id for a in adv]


def test_auto_stop():
    slow = LiveState(decode_tok_s=0.5, below_abandon_s=11)
    assert not should_auto_stop(slow)  # off by default: the GUI only offers to stop
    on = AdvisorSettings(auto_stop_below_abandon=True)
    assert should_auto_stop(slow, on)
    assert not should_auto_stop(LiveState(decode_tok_s=0.5, below_abandon_s=4), on)
    assert not should_auto_stop(LiveState(decode_tok_s=3.0, below_abandon_s=60), on)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"vram_margin_bytes": -1}, "vram_margin_bytes must be a number >= 0"),
        ({"ram_headroom_fraction": 1.5}, "ram_headroom_fraction must be a fraction"),
    ],
)
def test_bad_settings(kwargs, match):
    with pytest.raises(AdvisorError, match=match):
        AdvisorSettings(**kwargs)


def test_bad_live_type(models):
    plan = plan_memory(models["gemma"], PlanConfig(), [], BIG_HOST)
    with pytest.raises(AdvisorError, match="live must be a LiveState"):
        advise(plan, live={"decode_tok_s": 0.1})  # type: ignore[arg-type]


def test_default_constants_are_used_when_uncalibrated():
    assert SpeedConstants().host_decode_scale > 0 and SpeedConstants().gpu_bw_efficiency > 0


def test_abandon_advice_respects_the_band(models):
    """below-abandon-threshold needs even the optimistic end of the band under 1 tok/s: a model
    predicted at 0.4 tok/s is hopeless with the measured spread, not with a band that reaches 1.2."""
    host = HostSpec(64 * GiB, 48 * GiB, mem_bandwidth_bytes_s=5e9)
    plan = plan_memory(models["llama7b"], PlanConfig(n_ctx=4096), [], host)
    inp = speed_inputs([], host, n_threads=4)
    sp = predict_speed(plan, inp)
    assert sp.decode_tok_s < 0.5
    adv = [a for a in advise(plan, sp) if a.id == "below-abandon-threshold"]
    assert adv and adv[0].severity == "error" and "at most" in adv[0].message
    wide = predict_speed(plan, replace(inp, sigma_log=math.log(1.2 / sp.decode_tok_s)))
    assert wide.band[1] >= 1.0
    assert "below-abandon-threshold" not in [a.id for a in advise(plan, wide)]


def test_a_7b_that_measures_over_1_tok_s_is_not_abandoned(tmp_path):
    """The issue's case: a Llama-2-7B-shaped Q4_K_M file on this 2-core VM's CPU. The validation run
    (benchmarks/speed_cpu_runs.json: its one-thread CPU probe and its measured benches) measured it at
    1.65 tok/s with an empty cache and 1.17 tok/s at depth 2048; planned for a 2304-token context
    with that probe, the advisor does not say to abandon it (before, plan said 0.62 tok/s and offered
    --ctx 1024 on this file), while the same file on a machine a quarter as fast is still flagged."""
    import json
    from pathlib import Path

    from kvtuner.core.speed.cpu_probe import CpuRates
    from kvtuner.testing.gguf_factory import write_real_shape

    data = json.loads((Path(__file__).parents[1] / "benchmarks" / "speed_cpu_runs.json").read_text())
    measured = {r["depth"]: r["decode_tok_s"] for r in data["runs"] if r["key"] == "llama-2-7b"}
    assert measured[0] > measured[2048] > 1.0
    rates = CpuRates.from_dict(data["probe"])
    m = ModelProfile.from_gguf(write_real_shape(tmp_path / "llama-2-7b.gguf", "llama-2-7b", "Q4_K_M"))
    host = HostSpec(24 * GiB, 20 * GiB, mem_bandwidth_bytes_s=20e9)
    plan = plan_memory(m, PlanConfig(n_ctx=2304), [], host)
    sp = predict_speed(plan, speed_inputs([], host, n_threads=1, cpu=rates))
    assert sp.decode_tok_s == pytest.approx(measured[0], rel=0.2)
    assert "below-abandon-threshold" not in [a.id for a in advise(plan, sp)]
    slow = replace(
        rates,
        decode_bytes_s={t: v / 4 for t, v in rates.decode_bytes_s.items()},
        attn_decode_s={k: v * 4 for k, v in rates.attn_decode_s.items()},
    )
    sp4 = predict_speed(plan, speed_inputs([], host, n_threads=1, cpu=slow))
    assert "below-abandon-threshold" in [a.id for a in advise(plan, sp4)]
