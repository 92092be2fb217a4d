"""Routing data in zero-weight MoE fixtures (kvtuner/testing/gguf_factory.py ``write_routing_data``): the
tensors a router's choice depends on carry data, every other weight stays a hole, and the routers
computed from the file send different tokens to different experts."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np

from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import (
    MXFP4_NORMAL_EXPONENT,
    is_routing_tensor,
    write_model,
    write_mxfp4_scales,
    write_routing_data,
)

Q = gguf.GGMLQuantizationType


def _small_gpt_oss(tmp_path, embd_type: int):
    s = F.gpt_oss(n_layer=2, E=256, n_head=4, n_head_kv=2, head=64, n_expert=8, n_expert_used=2, n_ff_exp=256, V=512)
    rows = [(n, sh, embd_type if n == "token_embd.weight" else t) for n, sh, t in s.tensors]
    path = write_model(tmp_path / "moe.gguf", dataclasses.replace(s, tensors=rows))
    return write_routing_data(path)


def test_routing_tensors_carry_data_and_the_rest_stays_zero(tmp_path):
    path = _small_gpt_oss(tmp_path, Q.Q8_0)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for name, t in tensors.items():
        data = np.asarray(t.data)
        if name.endswith("_norm.weight"):
            assert np.all(data == 1.0), name  # unit norms
        elif is_routing_tensor(name):
            assert np.count_nonzero(data) > 0.9 * data.size, name  # embedding, router weight and bias
        else:
            assert not np.any(data), name  # attention, experts, sinks, biases: zero
    assert is_routing_tensor("blk.1.ffn_gate_inp.bias") and is_routing_tensor("blk.3.exp_probs_b.bias")
    assert not is_routing_tensor("blk.1.ffn_gate_exps.weight")


def test_q4_k_embeddings_are_centered_and_tokens_pick_their_own_experts(tmp_path):
    # Q4_K values are d*sc*q - dmin*m: with dmin 0 every embedding would be >= 0 and the routers'
    # logits would share one large component, favouring a few experts for every token
    path = _small_gpt_oss(tmp_path, Q.Q4_K)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    emb = tensors["token_embd.weight"]
    x = gguf.dequantize(np.asarray(emb.data).reshape(512, -1), Q.Q4_K).reshape(512, 256).astype(np.float64)
    assert abs(x.mean()) < 0.05 * x.std()
    x /= np.sqrt((x**2).mean(1, keepdims=True))
    for il in range(2):
        w = np.asarray(tensors[f"blk.{il}.ffn_gate_inp.weight"].data).reshape(8, 256)
        logits = x[:128] @ w.T + np.asarray(tensors[f"blk.{il}.ffn_gate_inp.bias"].data)
        top = np.argsort(-logits, axis=1)[:, :2]
        assert len(np.unique(top)) == 8  # all experts hit by 128 tokens
        assert len({tuple(sorted(t)) for t in top}) >= 20  # of the 28 pairs


def test_mxfp4_blocks_get_a_normal_scale_and_stay_zero(tmp_path):
    # a zero E8M0 exponent is 2**-128, a subnormal float: the MXFP4 kernels run 2.7x slower on it
    s = F.gpt_oss(n_layer=1, E=256, n_head=4, n_head_kv=2, head=64, n_expert=8, n_expert_used=2, n_ff_exp=256, V=512)
    rows = [(n, sh, Q.MXFP4 if n.endswith("_exps.weight") else t) for n, sh, t in s.tensors]
    path = write_mxfp4_scales(write_model(tmp_path / "mx.gguf", dataclasses.replace(s, tensors=rows)))
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    mx = [t for t in tensors.values() if t.tensor_type == Q.MXFP4]
    assert len(mx) == 3
    for t in mx:
        blocks = np.asarray(t.data).reshape(-1, 17)
        assert np.all(blocks[:, 0] == MXFP4_NORMAL_EXPONENT) and not np.any(blocks[:, 1:]), t.name
        assert not np.any(gguf.dequantize(np.asarray(t.data), Q.MXFP4)), t.name  # the weights stay zero
    for name, t in tensors.items():
        if t.tensor_type != Q.MXFP4 and not is_routing_tensor(name):
            assert not np.any(np.asarray(t.data)), name  # nothing else written
