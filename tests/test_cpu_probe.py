"""The CPU probe (kvtuner.core.speed.cpu_probe, kvtuner.runner.probe): its arithmetic by hand, its
probe models as llama.cpp files, and one real probe through the CLI that the next plan uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.speed.cpu_probe import (ATTN_DEPTH, ATTN_LAYERS, OVERHEAD_GEN, CpuRates, ProbeError,
                                          ProbeRun, attention_model, attn_key, attn_key_kv, matrix_model, probe_needs,
                                          probe_plan, rates_from_runs, write_probe_model)


def test_rates_from_runs_by_hand():
    b, p = matrix_model("Q8_0").matrix_bytes_params()
    assert p == 4 * (4096 * (4096 + 1024 + 1024) + 4096 * 4096 + 3 * 4096 * 14336)
    assert b == p // 32 * 34
    runs = [
        # overhead: 24 layers 1.24 ms per token, 6 layers 0.7 ms -> 30 us per layer, 0.52 ms per token;
        # prompts 0.0118 s and 0.01 s -> 0.1 ms per layer per prompt batch
        ProbeRun("overhead:24", 0, 8, 0.0118, OVERHEAD_GEN, OVERHEAD_GEN * 1.24e-3),
        ProbeRun("overhead:6", 0, 8, 0.01, OVERHEAD_GEN, OVERHEAD_GEN * 0.70e-3),
        # attention, 32 query heads over 8 KV heads of 128: +8 ms per token at depth 2048 over 4 x 32 x 2048 head-cells
        ProbeRun("attn:32/8/128", 0, 64, 0.10, 32, 32 * 2e-3),
        ProbeRun("attn:32/8/128", ATTN_DEPTH, 64, 0.10 + 0.262144, 32, 32 * 10e-3),
        # matrix Q8_0: 20 ms per token of which 4 x 30 us + 0.52 ms are fixed costs; prompts of 64 and
        # 16 tokens in 2.00092 s and 0.80092 s, of which 0.52 ms + 4 x 0.1 ms are fixed
        ProbeRun("matrix:Q8_0", 0, 64, 2.00092, 16, 16 * 20e-3),
        ProbeRun("matrix:Q8_0", 0, 16, 0.80092, 0, 0.0),
    ]
    r = rates_from_runs(runs, 2, load_avg=0.5)
    assert r.layer_s == pytest.approx(30e-6) and r.token_s == pytest.approx(0.52e-3)
    assert r.layer_prefill_s == pytest.approx(0.1e-3)
    assert r.attn_decode_s == {"32/8/128": pytest.approx(8e-3 / (ATTN_LAYERS * 32 * ATTN_DEPTH))}
    assert r.attn_prefill_s["32/8/128"] == pytest.approx(0.262144 / (ATTN_LAYERS * 32 * ATTN_DEPTH * 64))
    assert r.decode_bytes_s["Q8_0"] == pytest.approx(b / (20e-3 - 4 * 30e-6 - 0.52e-3))
    # rates at 64 and 16 rows: r1 = 2p x 64 / 2 s, r2 = 2p x 16 / 0.8 s: r(b) = peak b / (b + half)
    r1, r2 = 2 * p * 64 / 2.0, 2 * p * 16 / 0.8
    half = 64 * 16 * (r1 - r2) / (64 * r2 - 16 * r1)
    assert r.half_batch["Q8_0"] == pytest.approx(half) and half == pytest.approx(16.0)
    assert r.prefill_flop_s["Q8_0"] == pytest.approx(r1 * (64 + half) / 64)
    assert r.prefill_rate("Q8_0", 16) == pytest.approx(r2)
    assert (r.n_threads, r.load_avg) == (2, 0.5)
    assert CpuRates.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    with pytest.raises(ProbeError, match="no run of attn:32/8/128 at depth 2048"):
        rates_from_runs(runs[:3] + runs[4:], 2)
    with pytest.raises(ProbeError, match="no run of matrix:Q8_0"):
        rates_from_runs(runs[:5], 2)


def test_noise_never_makes_a_negative_rate():
    runs = [ProbeRun("overhead:24", 0, 8, 0.01, 64, 64e-3), ProbeRun("overhead:6", 0, 8, 0.01, 64, 65e-3),
            ProbeRun("attn:16/2/64", 0, 64, 0.1, 32, 0.1), ProbeRun("attn:16/2/64", ATTN_DEPTH, 64, 0.09, 32, 0.09)]
    r = rates_from_runs(runs, 1)
    assert r.layer_s > 0 and r.token_s > 0 and r.attn_decode_s["16/2/64"] > 0 and r.attn_prefill_s["16/2/64"] > 0
    assert r.layer_prefill_s > 0


def test_bad_records_and_types():
    with pytest.raises(ProbeError, match="malformed CPU probe record"):
        CpuRates.from_dict({"n_threads": 1})
    with pytest.raises(ProbeError, match="rates must be finite"):
        CpuRates.from_dict({**CpuRates(1, {"Q8_0": -1.0}, {}, 0, 0, {}, {}).to_dict()})
    with pytest.raises(ProbeError, match="no CPU probe for weight type IQ1_S"):
        matrix_model("IQ1_S")
    assert [m.key for m in probe_plan(["Q6_K", "F32x", "q4_k"], ["16/8/256", "32/8/64", "4/4/7"])] == [
        "overhead:24", "overhead:6", "attn:16/8/256", "attn:32/8/64", "matrix:Q4_K", "matrix:Q6_K"]
    with pytest.raises(ProbeError, match="no CPU attention probe for head size 7"):
        attention_model("4/4/7")
    with pytest.raises(ProbeError, match="query heads a multiple of KV heads"):
        attention_model("32/5/128")


def test_probe_models_are_sparse_llama_files(tmp_path):
    m = attention_model("32/8/128")
    path = write_probe_model(tmp_path / "attn.gguf", m)
    prof = ModelProfile.from_gguf(path)
    assert (prof.architecture, prof.n_layer, prof.n_head[0], prof.n_head_kv[0], prof.head_dim_k) == ("llama", 4, 32, 8, 128)
    q4 = write_probe_model(tmp_path / "q4.gguf", matrix_model("Q4_K"))
    assert os.stat(q4).st_blocks * 512 < 1 << 20 < os.path.getsize(q4)  # a hole, not data
    assert ModelProfile.from_gguf(q4).layer_bytes[0] == matrix_model("Q4_K").matrix_bytes_params()[0] // 4 + 2 * 4096 * 4


def test_probe_needs_the_models_types_and_head_sizes(default_profile):
    types, dims = probe_needs(default_profile)
    assert types == ("Q4_K", "Q5_0", "Q6_K", "Q8_0") and dims == ("4/1/256",)  # Gemma 3 270M: MQA, 256-wide heads


def test_real_probe_is_stored_and_used_by_the_next_plan(tmp_path):
    """One real probe (llama.cpp in a child, ~15-40 s), then ``kvtuner plan`` predicts with it."""
    env = {**os.environ, "KVTUNER_DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "kvtuner.cli", "probe", "--types", "Q4_0", "--attn", "8/2/64,8/2/64@q8_0", "-t", "1",
                          "--json"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    rates = CpuRates.from_dict(json.loads(out.stdout))
    assert set(rates.decode_bytes_s) == {"Q4_0"} and rates.n_threads == 1
    assert 1e8 < rates.decode_bytes_s["Q4_0"] < 1e12 and 1e8 < rates.prefill_flop_s["Q4_0"] < 1e14
    assert 0 < rates.attn_decode_s["8/2/64"] < 1e-5 and 0 < rates.token_s < 0.1 and rates.half_batch["Q4_0"] >= 0
    assert 0 < rates.attn_decode_s["8/2/64@q8_0"] < 1e-5 and 0 < rates.attn_prefill_s["8/2/64@q8_0"] < 1e-5
    plan = subprocess.run([sys.executable, "-m", "kvtuner.cli", "plan", "-t", "1", "--no-gpu", "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    doc = json.loads(plan.stdout)
    assert any("llama.cpp probe" in s for s in doc["speed"]["sources"])
    bad = subprocess.run([sys.executable, "-m", "kvtuner.cli", "probe", "--types", "Q9_9"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert bad.returncode == 2 and "cannot probe Q9_9" in bad.stderr


def test_a_busy_repetition_does_not_become_the_probe_figure():
    """The token time is the fastest repetition's median: a repetition slowed down as a whole
    (another job on the machine) and single interrupted tokens are both left out."""
    from kvtuner.runner.probe import fastest_token_s

    quiet = [(0, 0.010), (0, 0.011), (0, 0.012), (0, 0.5)]        # one interrupted token
    busy = [(1, 0.030), (1, 0.031), (1, 0.029), (1, 0.032)]        # the whole repetition at 1/3 speed
    assert fastest_token_s(quiet + busy) == pytest.approx(0.0115)
    assert fastest_token_s(busy) == pytest.approx(0.0305)
    with pytest.raises(ValueError):
        fastest_token_s([])


def test_attention_keys_carry_the_kv_pair_that_is_not_f16():
    """CPU flash attention takes its vectorised paths only with f16/f32 K and V of one type
    (ggml-cpu/ops.cpp): any other pair is probed under its own key, and a key not probed yet costs
    what the same shape costs with f16 K/V."""
    assert attn_key(32, 8, 128) == attn_key(32, 8, 128, "f16", "f16") == "32/8/128"
    assert attn_key(32, 8, 128, "q8_0", "q8_0") == "32/8/128@q8_0"
    assert attn_key(32, 8, 128, "f16", "q4_0") == "32/8/128@f16+q4_0"
    assert attn_key_kv("32/8/128@f16+q4_0") == ("32/8/128", "f16", "q4_0")
    assert attn_key_kv("32/8/128") == ("32/8/128", "f16", "f16")
    m = attention_model("4/1/256@q8_0")
    assert (m.key, m.n_head, m.n_head_kv, m.head_dim) == ("attn:4/1/256@q8_0", 4, 1, 256)
    with pytest.raises(ProbeError, match="K/V type"):
        attention_model("4/1/256@q9_9")
    r = CpuRates(1, {}, {}, 0.0, 0.0, {"32/8/128": 1e-7, "32/8/128@q8_0": 3e-7}, {"32/8/128": 1e-8})
    assert r.attn_cost(r.attn_decode_s, "32/8/128@q8_0") == 3e-7
    assert r.attn_cost(r.attn_decode_s, "32/8/128@q4_0") == 1e-7  # not probed: the f16 figure
    assert r.attn_cost(r.attn_decode_s, "32/8/64") == pytest.approx(0.5e-7)  # nearest f16 shape, never a q8_0 one


def test_a_tune_probes_the_attention_of_every_kv_pair_it_ranks(default_profile):
    _, dims = probe_needs(default_profile, [("f16", "f16"), ("q8_0", "q8_0"), ("f16", "q8_0")])
    assert dims == ("4/1/256", "4/1/256@f16+q8_0", "4/1/256@q8_0")


def test_kv_pairs_whose_block_does_not_divide_the_head_are_never_probed(tmp_path):
    """llama.cpp refuses a q8_0 cache for 80-wide heads (block of 32): a tune of such a model must
    not put that pair in the probe, which is all-or-nothing (StableLM-3B, phi-2)."""
    import gguf_families as F
    from gguf_factory import write_model
    from kvtuner.core.tune import kv_type_pairs

    prof = ModelProfile.from_gguf(write_model(tmp_path / "s.gguf", F.stablelm(n_layer=2)))
    pairs = kv_type_pairs(prof, "q4_0", gpu=False)
    assert pairs == [("f16", "f16")]
    assert probe_needs(prof, [("f16", "f16"), ("q8_0", "q8_0")])[1] == ("32/32/80",)
    with pytest.raises(ProbeError, match="does not divide"):
        attention_model("32/32/80@q8_0")
    assert attention_model("32/8/128@Q8_0+q8_0").key == "attn:32/8/128@q8_0"
    assert attention_model("32/8/128@f16").key == "attn:32/8/128"
    only = CpuRates(1, {}, {}, 0.0, 0.0, {"32/8/128@q8_0": 3e-7}, {})
    assert only.attn_cost(only.attn_decode_s, "32/8/128") == 3e-7  # never free
