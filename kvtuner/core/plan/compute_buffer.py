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

from ..units import pad_to

if TYPE_CHECKING:  # pragma: no cover
    from .kv_cache import LayerKV
    from ..model.profile import ModelProfile


@dataclass(frozen=True)
class ComputeEstimate:
    """Compute buffer bytes per device name (``CPU``, ``CUDA0``...).

    ``source`` is ``"estimate"`` or ``"dry-run"`` (exact, from llama.cpp itself).
    """

    bytes_by_device: dict[str, int] = field(default_factory=dict)
    source: str = "estimate"
    #: the analytic estimate, kept when exact figures replace it (for side-by-side display)
    estimate_by_device: dict[str, int] = field(default_factory=dict)

    def bytes_on(self, device: str) -> int:
        """Bytes on ``device`` (0 if none)."""
        return self.bytes_by_device.get(device, 0)

    def with_exact(self, exact: dict[str, int]) -> "ComputeEstimate":
        """A copy whose figures come from a dry-run (devices not in ``exact`` keep 0)."""
        estimate = self.estimate_by_device or self.bytes_by_device
        return replace(self, bytes_by_device=dict(exact), source="dry-run", estimate_by_device=dict(estimate))

    def estimate_on(self, device: str) -> int:
        """The analytic estimate on ``device`` even when exact figures are known."""
        return (self.estimate_by_device or self.bytes_by_device).get(device, 0)

    @property
    def label(self) -> str:
        """Human label of the source."""
        return "exact (llama.cpp dry-run)" if self.source == "dry-run" else "estimate (plan --verify asks llama.cpp for the exact figure)"


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
    E = model.n_embd
    TE = T * E * f32
    ff = model.metadata.get(f"{model.architecture}.feed_forward_length", 4 * E)
    n_ff = max(ff) if isinstance(ff, tuple) else int(ff or 4 * E)
    TF = T * n_ff * f32 * (max(1, model.n_expert_used) if model.n_expert else 1)
    kv_by_il = {l.il: l for l in kv_layers}
    # KQ mask: [n_kv, n_tokens] per graph (llama-graph.cpp build_attn_inp_kv), f16 with FA, f32 without;
    # sized by the full cache (the SWA mask is smaller and dies before the output phase)
    mask_full = n_ctx_seq * T * (2 if flash_attn else f32)

    def layer_peak(il: int) -> int:
        l = kv_by_il.get(il)
        ffn = mask_full + 3 * TF + 3 * TE  # gate, up, swiglu out; residual, norm, input
        if l is None:
            return ffn
        h = model.n_head[il] or max(model.n_head)
        if flash_attn:
            attn = mask_full + 4 * TE
        else:
            # KQ scores [n_kv, n_tokens, n_head] f32 (softmax runs in place) + the f32 mask
            attn = l.cells * T * h * f32 + n_ctx_seq * T * f32 + 6 * TE
        return max(attn, ffn)

    logits = model.n_vocab * T * f32
    if model.n_swa:
        output = logits + 2 * TE
    else:
        output = logits + TE + (mask_full if flash_attn and mask_full < logits else 0)

    devices = [host, *gpu_devices]
    result: dict[str, int] = {d: 0 for d in devices}
    first_dev = layer_devices[0] if n_layer else host
    for dev in devices:
        peak = max((layer_peak(il) for il in range(n_layer) if layer_devices[il] == dev), default=0)
        if layer_devices[n_layer] == dev:
            peak = max(peak, output)
        result[dev] = peak
    # the host always stages the token embeddings for the first offloaded layer
    if first_dev != host:
        result[host] = max(result[host], TE)
    return ComputeEstimate({d: b for d, b in result.items() if b}, "estimate")
