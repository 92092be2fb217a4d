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
    kv_f16: bool = True,
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
        kv_f16: K and V caches are both f16 (else the GPU's flash attention converts them).

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
    # on a GPU backend the output phase holds the logits and one hidden state: the mask and the
    # second state are freed by then (measured on an H200 with the vendored llama.cpp, CUDA0
    # compute buffer = n_vocab x T x 4 + n_embd x T x 4 to 0.01 MiB on llama, gemma3 and qwen3moe
    # shapes: benchmarks/gpu_truth/results/2026-11-30-h200.md)
    output_gpu = logits + TE

    devices = [host, *gpu_devices]
    result: dict[str, int] = {d: 0 for d in devices}
    first_dev = layer_devices[0] if n_layer else host
    for dev in devices:
        peak = max((layer_peak(il) for il in range(n_layer) if layer_devices[il] == dev), default=0)
        if layer_devices[n_layer] == dev:
            peak = max(peak, output_gpu if dev != host else output)
        result[dev] = peak
    if gpu_devices and flash_attn and T >= GPU_OP_OFFLOAD_MIN_BATCH:
        # Flash attention on a GPU reads K and V as f16 in its own memory: a layer whose KV is
        # quantized or lives elsewhere (-nkvo, host layers run there by op offload, the
        # tensor-override split) gets f16 copies of its whole K and V in the compute buffer
        # (ggml-cuda fattn-common.cuh launch_fattn converts non-F16 K/V; measured: llama-2-7B
        # shapes 168.0 MiB with -nkvo or q8_0 KV = mask 8 + 4 x n_embd x T x 4 + 128 MiB copies).
        for dev in gpu_devices:
            copies = max((l.cells * (model.n_embd_k_gqa(l.il) + model.n_embd_v_gqa(l.il)) * 2 for l in kv_layers
                          if not kv_f16 or l.device != dev), default=0)
            if copies and (result.get(dev) or dev == gpu_devices[0]):
                result[dev] = max(result[dev], mask_full + 4 * TE + copies)
    if gpu_devices and T >= GPU_OP_OFFLOAD_MIN_BATCH:
        # With a GPU the host buffer (CUDA_Host, pinned) holds the graph's inputs only: ggml-cuda
        # runs the large-batch matrix work of host layers on the GPU too (ggml-cuda.cu
        # ggml_backend_cuda_device_offload_op, batch >= 32), so host layers add nothing here.
        result[host] = host_inputs_bytes(model, n_ubatch=T, n_ctx_seq=n_ctx_seq, swa_cells=swa_cells,
                                         flash_attn=flash_attn, kv_layers=kv_layers)
    elif first_dev != host:
        # the host always stages the token embeddings for the first offloaded layer
        result[host] = max(result[host], TE)
    return ComputeEstimate({d: b for d, b in result.items() if b}, "estimate")


#: ggml-cuda offloads an op on host weights to the GPU from this batch size on
#: (ggml-cuda.cu ``ggml_backend_cuda_device_offload_op``: ``get_op_batch_size(op) >= 32``).
GPU_OP_OFFLOAD_MIN_BATCH = 32


def host_inputs_bytes(model: "ModelProfile", *, n_ubatch: int, n_ctx_seq: int, swa_cells: int, flash_attn: bool,
                      kv_layers: Sequence["LayerKV"]) -> int:
    """The host compute buffer of a run with a GPU: the graph inputs llama.cpp allocates in
    pinned host memory (``CUDA_Host``), bytes.

    - the input embeddings, twice: ``get_rows`` of the host-resident ``token_embd`` and its
      copy, ``2 x n_embd x n_ubatch x 4`` (llama-graph.cpp ``build_inp_embd``);
    - one KQ mask per KV cache, ``n_kv x n_ubatch``, f16 with flash attention and f32 without
      (llama-graph.cpp ``build_attn_inp_kv``; the sliding-window cache has its own, ``swa_cells``);
    - without flash attention, V is transposed and written through an index per element:
      ``n_embd_v_gqa x n_ubatch`` int64 per cache (llama-kv-cache.cpp ``build_input_v_idxs``).

    Measured on an H200 with llama-cpp-python 0.3.36's llama.cpp: 24.01 MiB for llama-3.1-8B
    shapes at 8K (flash attention), 48.01 at 32K, 36.01 without flash attention; 11.52 / 35.52 /
    22.51 MiB for Gemma 3 270M; within 0.1 MiB on 38 configurations
    (benchmarks/gpu_truth/results/2026-11-30-h200.md).
    """
    T = n_ubatch
    elt = 2 if flash_attn else 4
    total = 2 * model.n_embd * T * 4
    caches: dict[bool, int] = {}  # swa? -> widest V row of that cache
    for l in kv_layers:
        caches[l.swa] = max(caches.get(l.swa, 0), model.n_embd_v_gqa(l.il))
    for swa, v_width in caches.items():
        total += (swa_cells if swa else n_ctx_seq) * T * elt
        if not flash_attn:
            total += v_width * T * 8
    return total
