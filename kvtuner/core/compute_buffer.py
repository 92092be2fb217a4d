"""Compute buffers: the scratch memory ggml's scheduler reserves for the worst-case graph.

llama.cpp sizes them in ``llama_context::sched_reserve`` (src/llama-context.cpp) by building the
prompt-processing graph for ``n_tokens = min(n_ctx, n_ubatch)`` tokens with
``n_outputs = n_tokens`` and a full KV cache, and letting ``ggml-alloc`` pack its tensors. The
result depends on the allocator's packing, so an analytic figure is an *estimate*; a dry-run
(``kvtuner plan --verify``) gives the exact one, which :meth:`ComputeEstimate.with_exact` records.

The estimate takes the peak of two phases of that graph, per backend:

- a repeating layer: the persistent inputs (token embeddings ``n_embd x T`` f32, positions,
  the KQ masks ``n_kv x T`` in f16 with flash attention or f32 without), the residual stream
  and, without flash attention, the ``n_kv x T x n_head`` f32 attention scores and their
  softmax; or the FFN's ``n_ff x T`` f32 gate/up activations (llama-graph.cpp ``build_attn_mha``,
  ``build_ffn``);
- the output: ``n_vocab x T`` f32 logits plus the normed hidden state (llama-graph.cpp
  ``build_inp_out_ids`` / ``lm_head``).

Calibrated against llama.cpp dry-runs in tests/test_plan_vs_llama.py (the error per case is
printed there and stated in README).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

from .units import pad_to

if TYPE_CHECKING:  # pragma: no cover
    from .memory_plan import LayerKV
    from .model_profile import ModelProfile


@dataclass(frozen=True)
class ComputeEstimate:
    """Compute buffer bytes per device name (``CPU``, ``CUDA0``...).

    ``source`` is ``"estimate"`` or ``"dry-run"`` (exact, from llama.cpp itself).
    """

    bytes_by_device: dict[str, int] = field(default_factory=dict)
    source: str = "estimate"

    def bytes_on(self, device: str) -> int:
        """Bytes on ``device`` (0 if none)."""
        return self.bytes_by_device.get(device, 0)

    def with_exact(self, exact: dict[str, int]) -> "ComputeEstimate":
        """A copy whose figures come from a dry-run (devices not in ``exact`` keep 0)."""
        return replace(self, bytes_by_device=dict(exact), source="dry-run")


def estimate_compute(
    model: "ModelProfile",
    *,
    n_ubatch: int,
    n_seq: int,
    n_ctx_seq: int,
    swa_cells: int,
    flash_attn: bool,
    layer_devices: Sequence[str],
    kv_layers: Sequence["LayerKV"],
    gpu_devices: Sequence[str],
    host: str,
) -> ComputeEstimate:
    """Estimate the compute buffer of every backend, bytes.

    Args:
        model: the model.
        n_ubatch: tokens of the reserve graph (already ``min(n_ctx, n_batch, n_ubatch)``).
        n_seq: sequences (outputs of the decode graph).
        n_ctx_seq: cells of full-attention layers per stream; ``swa_cells`` of SWA layers.
        flash_attn: flash attention on (KQ never materialised).
        layer_devices: device of layers 0..n_layer (the last entry is the output layer).
        kv_layers: per-layer KV placement (attention runs where its KV is when they differ).
        gpu_devices: GPU device names; ``host``: the host device name.

    Returns:
        A :class:`ComputeEstimate` with ``source="estimate"``.
    """
    T = n_ubatch
    f32 = 4
    n_layer = model.n_layer
    n_embd = model.n_embd
    n_vocab = model.n_vocab
    n_head = max(model.n_head) if model.n_head else 0
    n_ff = int(model.metadata.get(f"{model.architecture}.feed_forward_length", 4 * n_embd) or 4 * n_embd) \
        if not isinstance(model.metadata.get(f"{model.architecture}.feed_forward_length"), tuple) \
        else max(model.metadata[f"{model.architecture}.feed_forward_length"])
    kv_by_il = {l.il: l for l in kv_layers}
    T_pad = pad_to(T, 64)  # GGML_KQ_MASK_PAD

    def mask_bytes(n_kv: int) -> int:
        return n_kv * T_pad * (2 if flash_attn else f32)

    def layer_peak(il: int) -> int:
        l = kv_by_il.get(il)
        n_kv = l.cells if l else 0
        hd_k = model.head_dim_k_at(il)
        hd_v = model.head_dim_v_at(il)
        h = model.n_head[il] or n_head
        q = hd_k * h * T * f32
        cur = n_embd * T * f32
        if l is None:
            attn = 0
        elif flash_attn:
            attn = q + hd_v * h * T * f32
        else:
            attn = q + 2 * n_kv * T * h * f32  # KQ scores and their softmax
        ffn = 3 * n_ff * T * f32 if model.n_expert == 0 else 3 * n_ff * T * f32 * max(1, model.n_expert_used)
        return 2 * cur + max(attn, ffn)

    devices = [host, *gpu_devices]
    result: dict[str, int] = {d: 0 for d in devices}
    # persistent inputs live on the device of the first layer that uses them
    first_dev = layer_devices[0] if n_layer else host
    full_cells = n_ctx_seq
    inputs = n_embd * T * f32 + T * 4 + mask_bytes(full_cells) + (mask_bytes(swa_cells) if model.n_swa else 0)
    for dev in devices:
        ids = [il for il in range(n_layer) if layer_devices[il] == dev]
        peak = max((layer_peak(il) for il in ids), default=0)
        if peak:
            peak += inputs
        if layer_devices[n_layer] == dev:
            peak = max(peak, n_vocab * T * f32 + 2 * n_embd * T * f32)
        result[dev] = peak
    # the host always stages the token embeddings for the first offloaded layer
    if first_dev != host:
        result[host] = max(result[host], n_embd * T * f32)
    return ComputeEstimate({d: b for d, b in result.items() if b}, "estimate")
