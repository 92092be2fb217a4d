"""PlanConfig -> llama.cpp layer/KV placement, including the experimental KV split."""

from __future__ import annotations

import re

import pytest

from kvtuner.core.plan.config import ALL_LAYERS, ConfigError, PlanConfig
from kvtuner.core.plan.placement import LayerPlacement, layer_regex, offloaded_repeating_layers, placement_for


@pytest.mark.parametrize(
    "ngl, n_layer, expected",
    [  # llama-model.cpp load_tensors: i_gpu_start = max(n_layer + 1 - ngl, 0), output layer first
        (ALL_LAYERS, 18, 18),
        (19, 18, 18),
        (99, 18, 18),
        (18, 18, 17),
        (1, 18, 0),
        (0, 18, 0),
        (5, 32, 4),
    ],
)
def test_offloaded_repeating_layers(ngl, n_layer, expected):
    assert offloaded_repeating_layers(ngl, n_layer) == expected


def test_default_keeps_llama_cpp_placement():
    p = placement_for(PlanConfig(n_gpu_layers=ALL_LAYERS), 18)
    assert p == LayerPlacement(ALL_LAYERS, True, (), 18, 18, False)


def test_kv_gpu_layers_zero_is_nkvo():
    p = placement_for(PlanConfig(n_gpu_layers=10, kv_gpu_layers=0), 32)
    assert (p.n_gpu_layers, p.offload_kqv, p.weight_overrides, p.experimental) == (10, False, (), False)


def test_kv_gpu_layers_equal_to_offloaded_is_the_default():
    p = placement_for(PlanConfig(n_gpu_layers=10, kv_gpu_layers=9), 32)
    assert (p.n_gpu_layers, p.offload_kqv, p.weight_overrides) == (10, True, ())


def test_kv_split_uses_tensor_overrides():
    # 32 layers, -ngl 21: output + layers 12..31 on GPU. KV of 8 of them in VRAM:
    # llama.cpp offloads output + layers 24..31 (ngl 9); layers 12..23 move by override.
    p = placement_for(PlanConfig(n_gpu_layers=21, kv_gpu_layers=8), 32)
    assert p.experimental
    assert p.n_gpu_layers == 9 and p.offload_kqv
    assert p.offloaded_repeating_layers == 20 and p.kv_gpu_layers == 8
    ((pattern, device),) = p.weight_overrides
    assert device == "CUDA0"
    assert pattern == r"^blk\.(12|13|14|15|16|17|18|19|20|21|22|23)\."
    rx = re.compile(pattern)
    moved = {il for il in range(32) if rx.search(f"blk.{il}.attn_q.weight")}
    assert moved == set(range(12, 24))
    # never matches other tensors or prefixes of other layer numbers
    assert not rx.search("blk.1.attn_q.weight") and not rx.search("blk.123.attn_q.weight")
    assert not rx.search("token_embd.weight") and not rx.search("output.weight")


def test_kv_split_with_all_layers():
    p = placement_for(PlanConfig(n_gpu_layers=ALL_LAYERS, kv_gpu_layers=1), 4)
    assert p.n_gpu_layers == 2
    assert p.weight_overrides == ((r"^blk\.(0|1|2)\.", "CUDA0"),)


def test_kv_split_on_another_device():
    p = placement_for(PlanConfig(n_gpu_layers=5, kv_gpu_layers=2), 8, device="CUDA1")
    assert p.weight_overrides == ((r"^blk\.(4|5)\.", "CUDA1"),)


def test_too_many_kv_layers_says_what_to_change():
    with pytest.raises(ConfigError, match=r"--kv-gpu-layers 12 exceeds the 9 repeating layers offloaded by --ngl 10"):
        placement_for(PlanConfig(n_gpu_layers=10, kv_gpu_layers=12), 32)


def test_layer_regex_dedupes_and_sorts():
    assert layer_regex([3, 1, 3]) == r"^blk\.(1|3)\."
    with pytest.raises(ValueError):
        layer_regex([])


def test_tensor_device_index_agrees_with_trying_every_pattern():
    """tensor_device's index (literal prefixes, block numbers, memo) gives the answer of trying
    each pattern in order with re.search, as llama-model-loader.cpp create_tensor does."""
    from kvtuner.core.plan.placement import _required_literal, tensor_device, tensor_overrides

    names = [
        f"blk.{i}.{t}.weight"
        for i in range(40)
        for t in (
            "attn_q",
            "attn_k",
            "attn_norm",
            "ffn_up",
            "ffn_down",
            "ffn_gate",
            "ffn_up_exps",
            "ffn_gate_up_exps",
            "ffn_down_chexps",
            "ffn_up_shexp",
        )
    ]
    names += [
        "token_embd.weight",
        "output.weight",
        "output_norm.weight",
        "xblk.3.ffn_up.weight",
        "blk.3.blk.13.ffn_up.weight",
    ]
    lists = [
        tensor_overrides(PlanConfig(n_cpu_ffn=33)),
        tensor_overrides(PlanConfig(n_cpu_moe=7, n_cpu_ffn=3, cpu_moe=True, tensor_overrides=("^output=CPU",))),
        tuple(
            p.split("=")
            for p in (
                r"blk\.1[0-9]\.ffn_up=CUDA0",
                r"attn_q|ffn_down=CPU",
                r"blk\.(2|3)\.=CUDA1",
                r"blk\.3+\.ffn=CPU",
                r"ffn_(up|gate)_?\w*=CPU",
                r"[.]13\.=CUDA0",
                r"blk\.13\.=CPU",
            )
        ),
    ]
    for ot in lists:
        ot = tuple((p, b) for p, b in ot)
        for name in names:
            want = next((b for p, b in ot if re.search(p, name)), "DEFAULT")
            assert tensor_device(name, "DEFAULT", ot) == want, (name, ot)
    assert _required_literal(r"blk\.12\.ffn_(up|down|gate)\.") == "blk.12.ffn_"
    assert _required_literal(r"attn_q|ffn_down") == "" and _required_literal(r"blk\.3+") == "blk."
    assert _required_literal(r"^output") == "output" and _required_literal(r"\d+") == ""
