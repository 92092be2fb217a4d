"""The CPU probe (kvtuner.core.speed.cpu_probe, kvtuner.runner.probe): its arithmetic by hand, its
probe models as llama.cpp files, and one real probe through the CLI that the next plan uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.speed.calibration import CalibrationStore
from kvtuner.core.speed.cpu_probe import (
    ATTN_DEPTH,
    ATTN_LAYERS,
    OVERHEAD_GEN,
    CpuRates,
    ProbeError,
    ProbeRun,
    attention_model,
    attn_key,
    attn_key_kv,
    layer_attn_key,
    matrix_model,
    nearest,
    probe_needs,
    probe_plan,
    rates_from_runs,
    write_probe_model,
)
from kvtuner.testing.cli import run_kvtuner


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
    runs = [
        ProbeRun("overhead:24", 0, 8, 0.01, 64, 64e-3),
        ProbeRun("overhead:6", 0, 8, 0.01, 64, 65e-3),
        ProbeRun("attn:16/2/64", 0, 64, 0.1, 32, 0.1),
        ProbeRun("attn:16/2/64", ATTN_DEPTH, 64, 0.09, 32, 0.09),
    ]
    r = rates_from_runs(runs, 1)
    assert r.layer_s > 0 and r.token_s > 0 and r.attn_decode_s["16/2/64"] > 0 and r.attn_prefill_s["16/2/64"] > 0
    assert r.layer_prefill_s > 0


def test_bad_records_and_types():
    with pytest.raises(ProbeError, match="malformed CPU probe record"):
        CpuRates.from_dict({"n_threads": 1})
    with pytest.raises(ProbeError, match="rates must be finite"):
        CpuRates.from_dict({**CpuRates(1, {"Q8_0": -1.0}, {}, 0, 0, {}, {}).to_dict()})
    with pytest.raises(ProbeError, match="no CPU probe for weight type Q8_K"):
        matrix_model("Q8_K")
    assert [m.key for m in probe_plan(["Q6_K", "F32x", "q4_k"], ["16/8/256", "32/8/64", "4/4/7"])] == [
        "overhead:24",
        "overhead:6",
        "attn:16/8/256",
        "attn:32/8/64",
        "matrix:Q4_K",
        "matrix:Q6_K",
    ]
    with pytest.raises(ProbeError, match="no CPU attention probe for head size 7"):
        attention_model("4/4/7")
    with pytest.raises(ProbeError, match="query heads a multiple of KV heads"):
        attention_model("32/5/128")


def test_an_unprobed_type_takes_the_nearest_of_its_kind():
    """A table-lookup type (i-quant) reads the nearest probed lookup type, a streaming type the
    nearest streaming one or the fallback: their kernels are bound by different work."""
    table = {"Q4_K": 8.45e9, "Q3_K": 7.63e9, "IQ4_XS": 4.34e9}
    assert nearest(table, "IQ3_XXS") == 4.34e9  # not Q3_K, the nearest in bits
    assert nearest(table, "Q2_K") == 7.63e9
    assert nearest({"Q4_K": 8.45e9}, "IQ3_XXS") == 8.45e9  # no lookup type probed: the nearest in bits
    assert nearest({"*": 15e9, "IQ3_XXS": 6.8e9}, "Q4_K") == 15e9  # the fallback, not a lookup type's rate
    with pytest.raises(ProbeError, match="run the CPU probe"):
        nearest({}, "Q4_K")


def test_probe_models_are_sparse_llama_files(tmp_path):
    m = attention_model("32/8/128")
    path = write_probe_model(tmp_path / "attn.gguf", m)
    prof = ModelProfile.from_gguf(path)
    assert (prof.architecture, prof.n_layer, prof.n_head[0], prof.n_head_kv[0], prof.head_dim_k) == (
        "llama",
        4,
        32,
        8,
        128,
    )
    q4 = write_probe_model(tmp_path / "q4.gguf", matrix_model("Q4_K"))
    assert os.stat(q4).st_blocks * 512 < 1 << 20 < os.path.getsize(q4)  # a hole, not data
    assert (
        ModelProfile.from_gguf(q4).layer_bytes[0] == matrix_model("Q4_K").matrix_bytes_params()[0] // 4 + 2 * 4096 * 4
    )


def test_probe_needs_the_models_types_and_head_sizes(default_profile):
    types, dims = probe_needs(default_profile)
    assert types == ("Q4_K", "Q5_0", "Q6_K", "Q8_0") and dims == ("4/1/256",)  # Gemma 3 270M: MQA, 256-wide heads


@pytest.mark.llama
@pytest.mark.slow
def test_real_probe_is_stored_and_used_by_the_next_plan(tmp_path):
    """One real probe (llama.cpp in a child, ~15-40 s), then ``kvtuner plan`` predicts with it."""
    env = {**os.environ, "KVTUNER_DATA_DIR": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtuner.cli",
            "probe",
            # the default model's kernels (a plan uses a stored probe only when it covers the
            # model: kvtuner.core.speed.cpu_probe.probe_covers), a table-lookup type, and a K/V pair of
            # another shape
            "--types",
            "Q4_K,Q5_0,Q6_K,Q8_0,IQ3_XXS",
            "--attn",
            "4/1/256,8/2/64,8/2/64@q8_0",
            "-t",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    rates = CpuRates.from_dict(json.loads(out.stdout))
    assert set(rates.decode_bytes_s) <= {"Q4_K", "Q5_0", "Q6_K", "Q8_0", "IQ3_XXS"} and rates.n_threads == 1
    assert "Q4_K" in rates.decode_bytes_s  # an implausible type may be left out, not the main one
    assert "IQ3_XXS" in rates.decode_bytes_s  # a lookup type's slow kernel is never taken for a busy reading
    assert 1e8 < rates.decode_bytes_s["Q4_K"] < 1e12 and 1e8 < rates.prefill_flop_s["Q4_K"] < 1e14
    assert 0 < rates.attn_decode_s["8/2/64"] < 1e-5 and 0 < rates.token_s < 0.1 and rates.half_batch["Q4_K"] >= 0
    assert 0 < rates.attn_decode_s["8/2/64@q8_0"] < 1e-5 and 0 < rates.attn_prefill_s["8/2/64@q8_0"] < 1e-5
    stored = CalibrationStore(tmp_path / "calibration.json").cpu_rates(1)
    assert stored is not None and "Q4_K" in stored.decode_bytes_s, out.stderr
    plan = run_kvtuner("plan", "-t", "1", "--no-gpu", "--json", env=env, timeout=120)
    sources = json.loads(plan.stdout)["speed"]["sources"]
    if {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(stored.decode_bytes_s):
        assert any("llama.cpp probe" in s for s in sources), sources
    else:  # a type the plausibility rule left out (a loaded machine): the probe does not cover the model
        assert not any("llama.cpp probe" in s for s in sources), (sorted(stored.decode_bytes_s), sources)
    bad = run_kvtuner("probe", "--types", "Q9_9", env=env, timeout=60)
    assert bad.returncode == 2 and "cannot probe Q9_9" in bad.stderr


def test_a_busy_repetition_does_not_become_the_probe_figure():
    """The token time is the fastest repetition's median: a repetition slowed down as a whole
    (another job on the machine) and single interrupted tokens are both left out."""
    from kvtuner.runner.probe import fastest_token_s

    quiet = [(0, 0.010), (0, 0.011), (0, 0.012), (0, 0.5)]  # one interrupted token
    busy = [(1, 0.030), (1, 0.031), (1, 0.029), (1, 0.032)]  # the whole repetition at 1/3 speed
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
    from kvtuner.core.tune import kv_type_pairs
    from kvtuner.testing import gguf_families as F
    from kvtuner.testing.gguf_factory import write_model

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


def test_expert_keys_and_probe_models(tmp_path):
    """An expert probe is a llama MoE of the model's own expert shape and types (ggml's MUL_MAT_ID
    runs at a speed of its own per shape), with enough layers to outgrow the caches, routing data
    so tokens spread over the experts, and MXFP4 blocks with a normal scale."""
    from kvtuner.core.speed.cpu_probe import EXPERT_GEN, EXPERT_MIN_BYTES, EXPERT_PROMPT, expert_model
    from kvtuner.core.speed.expert_shapes import expert_key, parse_expert_key

    assert expert_key(2048, 768, 128, 8, ["q4_k"] * 3) == "2048/768/128/8@Q4_K"
    assert expert_key(2048, 1408, 64, 6, ["Q4_K", "Q4_K", "Q5_0"]) == "2048/1408/64/6@Q4_K,Q4_K,Q5_0"
    assert parse_expert_key("2048/1408/64/6@Q4_K,Q4_K,Q5_0") == (2048, 1408, 64, 6, ("Q4_K", "Q4_K", "Q5_0"))
    assert parse_expert_key("32/8/128") is None and parse_expert_key("1/2/3/4@A,B") is None
    m = expert_model("2048/768/128/8@Q4_K")  # Qwen3-30B-A3B: 340 MB of experts a layer
    per_layer = 3 * 2048 * 768 * 128 // 256 * 144
    assert m.n_layer == 2 and m.n_layer * per_layer >= EXPERT_MIN_BYTES
    assert m.runs == ((0, EXPERT_PROMPT, EXPERT_GEN),)  # a prompt and decode
    assert m.expert_bytes_params() == (2 * per_layer * 8 // 128, 2 * 3 * 2048 * 768 * 8)
    assert expert_model("256/128/8/2@Q8_0").n_layer == 16  # tiny experts: the most layers
    with pytest.raises(ProbeError, match="does not fit Q4_K"):
        expert_model("2048/1408/64/6@Q4_K")  # ffn_down_exps rows of 1408: llama-quantize falls back to Q5_0
    with pytest.raises(ProbeError, match="IQ1_S"):
        expert_model("256/128/8/2@IQ1_S")
    with pytest.raises(ProbeError, match="at most the experts"):
        expert_model("256/128/8/9@Q8_0")
    x = expert_model("256/256/8/2@MXFP4")
    path = write_probe_model(tmp_path / "x.gguf", x)
    prof = ModelProfile.from_gguf(path)
    assert (prof.architecture, prof.n_expert, prof.n_expert_used, prof.n_layer) == ("llama", 8, 2, x.n_layer)
    reader = gguf.GGUFReader(str(path))
    t = {r.name: r for r in reader.tensors}
    exps = np.asarray(t["blk.0.ffn_up_exps.weight"].data).reshape(-1)[:34]
    assert list(exps[[0, 17]]) == [127, 127] and not exps[1:17].any()  # scale 2^0 x 0.5, zero nibbles
    dense = gguf.GGUFReader(str(write_probe_model(tmp_path / "mx.gguf", matrix_model("MXFP4"))))
    assert np.asarray(next(x for x in dense.tensors if x.name == "blk.3.ffn_down.weight").data).reshape(-1)[-17] == 127
    emb = np.asarray(t["token_embd.weight"].data)
    assert emb.std() > 0.5 and np.asarray(t["blk.0.ffn_norm.weight"].data).min() == 1.0
    router0, router1 = (np.asarray(t[f"blk.{i}.ffn_gate_inp.weight"].data) for i in (0, 1))
    assert router0.std() > 0.5 and not np.array_equal(router0, router1)  # each layer routes on its own


def test_model_expert_keys_follow_the_tensor_table(tmp_path):
    """Per layer the expert shape and the gate/up/down types of its tensors (llama-quantize's
    Q4_K_M gives some layers' ffn_down_exps Q6_K: another key)."""
    from kvtuner.core.speed.cpu_probe import model_expert_keys, probe_expert_needs
    from kvtuner.testing.gguf_factory import ModelSpec, write_model

    dense = ModelProfile.from_gguf(write_model(tmp_path / "d.gguf", ModelSpec(n_layer=2)))
    assert model_expert_keys(dense) == (None, None) and probe_expert_needs(dense) == ()
    spec = ModelSpec(
        arch="qwen3moe",
        n_layer=3,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=1024,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        weight_type=gguf.GGMLQuantizationType.Q8_0,
        tensor_types={"ffn_down_exps": gguf.GGMLQuantizationType.Q4_K},
    )
    moe = ModelProfile.from_gguf(write_model(tmp_path / "m.gguf", spec))
    assert model_expert_keys(moe) == ("256/256/8/2@Q8_0,Q8_0,Q4_K",) * 3
    assert probe_expert_needs(moe) == ("256/256/8/2@Q8_0,Q8_0,Q4_K",)
    assert [m.key for m in probe_plan([], [], probe_expert_needs(moe))][-1] == "expert:256/256/8/2@Q8_0,Q8_0,Q4_K"


def test_expert_rates_from_runs_by_hand():
    from kvtuner.core.speed.cpu_probe import EXPERT_GEN, expert_model

    key = "256/256/8/2@Q8_0"
    m = expert_model(key)
    b, _ = m.expert_bytes_params()
    base = [
        ProbeRun("overhead:24", 0, 8, 0.0118, OVERHEAD_GEN, OVERHEAD_GEN * 1.24e-3),
        ProbeRun("overhead:6", 0, 8, 0.01, OVERHEAD_GEN, OVERHEAD_GEN * 0.70e-3),
    ]
    # a token: the selected experts' bytes at 4 GB/s plus m.n_layer x 30 us and 0.52 ms of fixed costs
    td = b / 4e9 + m.n_layer * 30e-6 + 0.52e-3
    r = rates_from_runs(base + [ProbeRun(f"expert:{key}", 0, 0, 0.0, EXPERT_GEN, EXPERT_GEN * td)], 1)
    assert r.expert_decode_bytes_s == {key: pytest.approx(4e9)}  # no matrix probe ran: nothing else subtracted
    assert CpuRates.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert r.merged(CpuRates(1, {}, {}, 0.0, 0.0, {}, {})).expert_decode_bytes_s == r.expert_decode_bytes_s
    assert r.expert_prefill_flop_s == {}  # no prompt timed
    # a prompt of P tokens: (L - 1) layers of every token and the last layer's output token, 2 of 8
    # experts each, at 20 GFLOP/s, plus the fixed costs (token_s + L x layer_prefill_s)
    P, fixed = 128, r.token_s + m.n_layer * r.layer_prefill_s
    flops = 2.0 * 3 * 256 * 256 * 2 * ((m.n_layer - 1) * P + 1)
    r = rates_from_runs(base + [ProbeRun(f"expert:{key}", 0, P, flops / 20e9 + fixed, EXPERT_GEN, EXPERT_GEN * td)], 1)
    assert r.expert_prefill_flop_s == {key: pytest.approx(20e9)}


@pytest.mark.llama
@pytest.mark.slow
def test_an_mla_attention_is_probed_with_its_own_latent_cache(tmp_path):
    """DeepSeek-V2's MLA (one KV head: a latent of kv_lora_rank plus RoPE as K, the latent as V) gets
    its own key and a deepseek2 probe model with that cache, which llama.cpp loads and times, and a
    plan of an MLA model then reads that cost rather than the nearest GQA shape's."""
    from kvtuner.testing import gguf_families as F
    from kvtuner.testing.gguf_factory import write_model

    path = write_model(
        tmp_path / "mla.gguf",
        F.deepseek2(
            n_layer=2, E=256, n_head=4, n_ff=256, n_expert=4, n_expert_used=2, n_ff_exp=128, n_shared=1, V=1024
        ),
    )
    prof = ModelProfile.from_gguf(path)
    assert (
        prof.is_mla
        and layer_attn_key(prof, 0) == "4/1/576/512"
        and layer_attn_key(prof, 0, "q8_0", "q8_0") == "4/1/576/512@q8_0"
    )
    assert probe_needs(prof)[1] == ("4/1/576/512",)
    probe = ModelProfile.from_gguf(write_probe_model(tmp_path / "probe.gguf", attention_model("4/1/576/512")))
    assert (probe.architecture, probe.n_layer, probe.is_mla, layer_attn_key(probe, 0)) == (
        "deepseek2",
        4,
        True,
        "4/1/576/512",
    )
    for bad in ("4/2/576/512", "4/1/512/512", "4/1/575/512"):  # two KV heads, no RoPE part, an odd one
        with pytest.raises(ProbeError, match="MLA"):
            attention_model(bad)
    env = {**os.environ, "KVTUNER_DATA_DIR": str(tmp_path)}
    out = run_kvtuner("probe", "--types", "F16", "--attn", "4/1/576/512", "-t", "1", "--json", env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    rates = CpuRates.from_dict(json.loads(out.stdout))
    assert 0 < rates.attn_decode_s["4/1/576/512"] < 1e-5 and 0 < rates.attn_prefill_s["4/1/576/512"] < 1e-5
    assert rates.attn_cost(rates.attn_decode_s, "4/1/576/512") == rates.attn_decode_s["4/1/576/512"]


@pytest.mark.llama
@pytest.mark.slow
def test_real_expert_probe_of_a_moe_model_is_used_by_its_plan(tmp_path):
    """``kvtuner probe MODEL`` on a MoE file times its expert shape through llama.cpp (MUL_MAT_ID
    on a probe model of that shape), and the next plan of that file probes nothing more."""
    from kvtuner.testing.gguf_factory import ModelSpec, write_model

    # Q4_K experts: a type that is no KV cache type (an expert key is never read as an attention K/V pair)
    spec = ModelSpec(
        arch="qwen3moe",
        n_layer=2,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=1024,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        weight_type=gguf.GGMLQuantizationType.Q4_K,
    )
    path = write_model(tmp_path / "moe.gguf", spec)
    env = {**os.environ, "KVTUNER_DATA_DIR": str(tmp_path)}
    out = run_kvtuner("probe", str(path), "-t", "1", "--json", env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    rates = CpuRates.from_dict(json.loads(out.stdout))
    key = "256/256/8/2@Q4_K"
    assert set(rates.expert_decode_bytes_s) == {key} and 1e8 < rates.expert_decode_bytes_s[key] < 1e12
    plan = run_kvtuner("plan", str(path), "-t", "1", "--no-gpu", "--json", env=env, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "timing llama.cpp" not in plan.stderr  # nothing left to probe
    assert any("llama.cpp probe" in s for s in json.loads(plan.stdout)["speed"]["sources"])
