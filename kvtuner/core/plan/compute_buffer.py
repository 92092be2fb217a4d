"""Compute buffers: the scratch memory ggml's scheduler reserves for the worst-case graph.

llama.cpp sizes them in ``llama_context::sched_reserve`` (src/llama-context.cpp) by building the
prompt-processing graph for ``n_tokens = min(n_ctx, n_ubatch)`` tokens with
``n_outputs = min(n_tokens, n_outputs_max)`` (every token in a generic context, one per slot in
llama-server b11434: :mod:`.build_rules` says which build and program a plan follows) and a full
KV cache, and letting ``ggml-alloc`` pack its tensors. The
result depends on the allocator's packing, so an analytic figure is an *estimate*; a dry-run
(``kvtuner plan --verify``) gives the exact one, which :meth:`ComputeEstimate.with_exact` records.

On the CPU alone, for the architectures :mod:`.reserve_graph` rebuilds (llama and
Mixtral-style MoE, Qwen2/Qwen2-MoE, Qwen3/Qwen3-MoE, OLMoE, Phi-3, Gemma 2, Gemma 3, StableLM, DeciLM
and the others its docstring lists), the
figure is computed the way llama.cpp computes it: the reserve graph is rebuilt node by node and
placed by a model of ggml-alloc (:mod:`.ggml_graph`); it equals llama.cpp's to the printed
0.01 MiB on every covered configuration of those architectures (tests/test_compute_exact.py,
tests/test_plan_vs_llama.py, tests/test_model_families.py), for the vendored build and for
llama-server and llama-fit-params b11434 (benchmarks/compute_builds.py, tests/test_build_rules.py).

Otherwise (other architectures, or a GPU in the plan) the estimate walks that graph by phases
(:func:`estimate_compute`): a repeating layer (the residual stream, the KQ masks still needed,
and the largest of its attention, feed-forward or MoE, and recurrent activations) and the
output (logits and hidden states, plus the holes freed inputs leave under them where measured).
ggml-alloc places tensors best-fit in freed blocks, so a large tensor lands on top of the blocks
freed before it; that packing is why the phase figure is an estimate.

The distribution over every configuration the tests cover is on docs/accuracy/memory.md
("Compute buffer", ``benchmarks/compute_accuracy.py --markdown``); the tests assert that no figure is under
llama.cpp's by more than 2% + 8 MiB (an under-estimate is an out-of-memory the user does not
see coming).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .build_rules import VENDORED, BuildRules
from .llama_constants import OFFLOAD_MIN_BATCH as GPU_OP_OFFLOAD_MIN_BATCH
from .reserve_graph import transformer_reserve_bytes, transformer_shape

if TYPE_CHECKING:  # pragma: no cover
    from ..model.profile import ModelProfile
    from .kv_cache import LayerKV


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

    def with_exact(self, exact: dict[str, int]) -> ComputeEstimate:
        """A copy whose figures come from a dry-run (devices not in ``exact`` keep 0)."""
        estimate = self.estimate_by_device or self.bytes_by_device
        return replace(self, bytes_by_device=dict(exact), source="dry-run", estimate_by_device=dict(estimate))

    def plus(self, device: str, n_bytes: int) -> ComputeEstimate:
        """A copy with ``n_bytes`` more on ``device`` (the tensor-override planner's weight copies,
        :mod:`kvtuner.core.plan.overrides`; added in memory_plan.py, not in this estimate)."""
        out = dict(self.bytes_by_device)
        out[device] = out.get(device, 0) + n_bytes
        return replace(self, bytes_by_device=out)

    def estimate_on(self, device: str) -> int:
        """The analytic estimate on ``device`` even when exact figures are known."""
        return (self.estimate_by_device or self.bytes_by_device).get(device, 0)

    @property
    def label(self) -> str:
        """Human label of the source."""
        return (
            "exact (llama.cpp dry-run)"
            if self.source == "dry-run"
            else "estimate (plan --verify asks llama.cpp for the exact figure)"
        )


def _meta_int(model: ModelProfile, key: str, default: int = 0) -> int:
    v = model.metadata.get(f"{model.architecture}.{key}", default)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else default


def _per_layer_ff(model: ModelProfile) -> list[int]:
    ff = model.metadata.get(f"{model.architecture}.feed_forward_length", 0)
    if isinstance(ff, tuple) and len(ff) == model.n_layer:
        return [int(x) for x in ff]
    return [int(ff) if isinstance(ff, int) else 0] * model.n_layer


def _ffn_bytes(model: ModelProfile, il: int, T: int, ff: list[int]) -> int:
    """Peak activations of layer ``il``'s feed-forward block for ``T`` tokens (f32), bytes.

    Dense (llama-graph.cpp ``build_ffn``): up and gate ``[n_ff, T]`` and their GLU product.
    MoE (``build_moe_ffn``): router logits/probabilities ``[n_expert, T]``, the selected experts'
    up/gate/product ``[n_ff_exp, n_expert_used, T]``, their down projections ``[n_embd,
    n_expert_used, T]``, plus a shared expert like a dense FFN.
    """
    a, E = model.architecture, model.n_embd
    n_exp, n_used = model.n_expert, max(1, model.n_expert_used)
    dense_lead = _meta_int(model, "leading_dense_block_count", 0)
    step = _meta_int(model, "interleave_moe_layer_step", 0)
    moe = n_exp > 0 and il >= dense_lead and (step <= 0 or (il + 1) % step == 0)
    if a in ("lfm2", "lfm2moe") and n_exp == 0:
        moe = False
    if not moe:
        return 3 * T * ff[il] * 4
    f_exp = _meta_int(model, "expert_feed_forward_length", 0) or (ff[il] // n_used if ff[il] else 0)
    shared = _meta_int(model, "expert_shared_feed_forward_length", 0)
    n_shared = _meta_int(model, "expert_shared_count", 0)
    if not shared and n_shared:
        shared = f_exp * n_shared
    if a == "llama4":
        shared = f_exp
    experts = 3 * T * f_exp * n_used * 4 + T * E * n_used * 4 + 3 * T * n_exp * 4
    return max(experts, 3 * T * shared * 4) + T * E * 4 * (1 if shared else 0)


def _recurrent_bytes(model: ModelProfile, T: int, n_seq: int) -> int:
    """Peak activations of one recurrent layer for ``T`` tokens, bytes: the input projection,
    the convolution window ``(d_conv - 1 + T) x conv_dim`` and its output, the scan's output and
    final states (mamba-base.cpp ``build_mamba2_layer``, delta-net-base.cpp, lfm2.cpp)."""
    a, E = model.architecture, model.n_embd
    d_conv = _meta_int(model, "ssm.conv_kernel", 0)
    d_inner = _meta_int(model, "ssm.inner_size", 0)
    d_state = _meta_int(model, "ssm.state_size", 0)
    n_group = _meta_int(model, "ssm.group_count", 0)
    dt_rank = _meta_int(model, "ssm.time_step_rank", 0)
    l_cache = _meta_int(model, "shortconv.l_cache", 0)
    n_rows = max(1, n_seq)
    if a in ("lfm2", "lfm2moe"):  # short conv: in_proj [3E, T], conv window and output
        return 4 * (3 * E * T + E * (l_cache - 1 + T) + 2 * E * T)
    if a in ("qwen35", "qwen35moe", "qwen3next"):  # gated delta net
        key_dim, value_dim = d_state * n_group, d_state * dt_rank
        conv_dim = 2 * key_dim + value_dim
        chunk = 64
        n_chunks = -(-T // chunk)
        per_chunk = dt_rank * chunk * chunk * n_chunks + dt_rank * d_state * chunk * n_chunks
        return 4 * (
            2 * conv_dim * T
            + conv_dim * (d_conv - 1 + T)
            + 2 * value_dim * T
            + 3 * per_chunk
            + d_state * d_state * dt_rank * n_rows
        )
    conv_dim = d_inner + 2 * n_group * d_state
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + dt_rank
    if a == "mamba":
        d_in_proj, conv_dim = 2 * d_inner, d_inner
    return 4 * (d_in_proj * T + conv_dim * (d_conv - 1 + T) + conv_dim * T + d_inner * T + d_state * d_inner * n_rows)


def estimate_compute(
    model: ModelProfile,
    *,
    n_ubatch: int,
    n_seq: int,
    n_ctx_seq: int,
    swa_cells: int,
    flash_attn: bool,
    layer_devices: Sequence[str],
    kv_layers: Sequence[LayerKV],
    gpu_devices: Sequence[str],
    host: str,
    kv_f16: bool = True,
    n_stream: int | None = None,
    type_k: str = "f16",
    type_v: str = "f16",
    rules: BuildRules = VENDORED,
) -> ComputeEstimate:
    """Estimate the compute buffer of every backend, bytes.

    The reserve graph (llama-context.cpp ``sched_reserve``: ``n_ubatch`` tokens, every token an
    output, a full cache) is walked phase by phase, and each backend's buffer is the largest of:

    - a repeating layer: the residual stream, the KQ masks still needed by later layers
      (``n_kv x T``; f16 with flash attention, f32 without; the sliding-window mask for iSWA
      caches), and the largest of its attention (Q, K, V and the flash-attention output; without
      flash attention the ``n_kv x T x n_head`` f32 scores, softmax in place), feed-forward
      (:func:`_ffn_bytes`) and recurrent (:func:`_recurrent_bytes`) activations;
    - the output: the ``n_vocab x T`` f32 logits and two ``n_embd x T`` hidden states.

    Args:
        model: the model.
        n_ubatch: tokens of the reserve graph (already ``min(n_ctx, n_batch, n_ubatch)``).
        n_seq: sequences (recurrent state rows).
        n_ctx_seq: cells of full-attention layers per stream; ``swa_cells`` of SWA layers.
        flash_attn: flash attention on (KQ never materialised).
        layer_devices: device of layers 0..n_layer (the last entry is the output layer).
        kv_layers: per-layer KV placement (attention runs where its KV is when they differ).
        gpu_devices: GPU device names; ``host``: the host device name.
        kv_f16: K and V caches are both f16 (else the GPU's flash attention converts them).
        n_stream: KV streams (``n_seq``, or 1 with a unified cache); ``None``: ``n_seq``.
        type_k, type_v: KV cache types (a quantized cache rotates Q/K or V: more graph nodes).
        rules: the llama.cpp build and program planned for (:mod:`.build_rules`): how many outputs
            the reserve graph holds (every token, or one per sequence in llama-server) and the
            build's embedding inputs.

    Plain transformers on the CPU alone (:func:`reserve_graph.transformer_shape` says which) skip
    the phase walk: their reserve graph is rebuilt node by node and placed by a model of ggml-alloc
    (:mod:`.reserve_graph`, :mod:`.ggml_graph`), which gives llama.cpp's figure to the byte.

    Returns:
        A :class:`ComputeEstimate` with ``source="estimate"``.
    """
    T = n_ubatch
    if not gpu_devices and all(d == host for d in layer_devices):
        shape = transformer_shape(model, kv_layers, type_k, type_v)
        if shape is not None:
            exact = transformer_reserve_bytes(
                shape,
                T,
                n_seq if n_stream is None else n_stream,
                flash_attn,
                n_seqs=n_seq,
                n_outputs=rules.n_outputs(T, n_seq),
                rules=rules,
            )
            return ComputeEstimate({host: exact}, "estimate")
    f32 = 4
    st = model.structure
    n_layer = model.n_layer
    E = model.n_embd
    TE = T * E * f32
    ff = _per_layer_ff(model)
    kv_by_il = {l.il: l for l in kv_layers}
    mask_b = 2 if flash_attn else f32
    attn_layers = [r.il for r in st.layers if (r.kv or r.reuse >= 0) and not r.nextn]
    full_last = max((il for il in attn_layers if not (st.layers[il].swa and st.is_iswa)), default=-1)
    swa_last = max((il for il in attn_layers if st.layers[il].swa and st.is_iswa), default=-1)
    full_mask = n_ctx_seq * T * mask_b
    swa_mask = swa_cells * T * mask_b
    recurrent = _recurrent_bytes(model, T, n_seq) if st.recurrent_layers else 0
    if recurrent and rules.rs_gather:
        # b11434 build_rs: beside ssm_scan's own state rows, one get_rows of the n_seq - 1 others
        recurrent += (
            4 * _meta_int(model, "ssm.state_size", 0) * _meta_int(model, "ssm.inner_size", 0) * max(0, n_seq - 1)
        )
    inputs = 4 * T * f32  # token ids, positions, output ids
    if rules.mixed_embd:  # b11434 build_inp_embd: the mixed-batch embeddings input and its dup, never freed
        inputs += 2 * TE
    n_out = rules.n_outputs(T, n_seq)  # logits rows: every token, or one per sequence (llama-server)
    # Gemma 3n / 4 per-layer embeddings: [n_embd_per_layer x n_layer, T] looked up and projected
    # once, alive through every layer (gemma4.cpp / gemma3n.cpp)
    per_layer = _meta_int(model, "embedding_length_per_layer_input", 256 if model.architecture == "gemma3n" else 0)
    inputs += 2 * per_layer * n_layer * T * f32

    def attn_bytes(il: int) -> int:
        r = st.layers[il]
        h = model.n_head[il] or max(model.n_head)
        q = T * h * r.head_k * f32
        kv = 0 if r.reuse >= 0 else T * model.n_head_kv[il] * (r.head_k + r.head_v) * f32
        out = T * h * r.head_v * f32
        mla = 2 * T * h * r.k_width * f32 if st.is_mla else 0  # absorbed queries [kv_lora + rope, n_head, T]
        # qwen35.cpp / qwen3next.cpp build_layer_attn: one projection [2 x head_k x n_head, T] holds
        # the query and its gate; both are views of it, so it stays allocated until the gate
        # multiplies the attention output, beside the normed query
        gated = 2 * q if model.architecture in ("qwen35", "qwen35moe", "qwen3next") else 0
        if flash_attn:
            return TE + max(q + kv, q + out) + mla + gated
        # the n_kv x T x n_head scores go on top of everything this layer allocated so far (the
        # norm, Q, K, V and their roped copies leave holes too small for them)
        l = kv_by_il.get(il)
        cells = l.cells if l is not None else (swa_cells if (r.swa and st.is_iswa) else n_ctx_seq)
        return 3 * TE + q + kv + cells * T * h * f32 + mla + gated

    def layer_peak(il: int) -> int:
        r = st.layers[il]
        if r.nextn:
            return 0
        live = TE + inputs
        if il <= full_last:
            live += full_mask
        if il <= swa_last:
            live += swa_mask
        parts = [TE + _ffn_bytes(model, il, T, ff)]
        if r.kv or r.reuse >= 0:
            parts.append(attn_bytes(il))
        if r.recurrent:
            parts.append(recurrent + (attn_bytes(il) if r.kv and model.architecture == "falcon-h1" else 0))
        return live + max(parts)

    # the output: logits and hidden states; inputs freed before it (KQ masks) leave holes the
    # logits cannot use when other blocks were allocated above them (hybrid memories and shared
    # KV layers, measured); MLA keeps its absorbed queries ([kv_lora + rope, n_head, T]) around
    output = model.n_vocab * n_out * f32 + (3 if model.n_expert and not st.is_mla else 2) * TE
    if model.architecture in ("qwen35", "qwen35moe", "qwen3next") or any(r.reuse >= 0 for r in st.layers):
        output += (full_mask if full_last >= 0 else 0) + (swa_mask if swa_last >= 0 else 0)
        output += 2 * per_layer * n_layer * T * f32
    elif swa_last >= 0:
        output += swa_mask  # the sliding-window mask's hole stays under the logits (iSWA caches, measured)
    if st.is_mla and st.kv_layers:
        output += 2 * T * max(model.n_head) * st.kv_layers[0].k_width * f32
    if rules.mixed_embd:
        # the mixed-batch embeddings input and its copy stay allocated to the end, and the token
        # rows set into the copy leave a hole under them the logits cannot use (b11434
        # build_inp_embd; GGML_SCHED_DEBUG dumps of qwen35 shapes: the only difference from the
        # vendored graph, 3 x n_embd x T x 4 bytes more)
        output += 3 * TE
    # on a GPU backend the output phase of an ordinary transformer holds the logits and one
    # hidden state: the masks and the second state are freed by then (measured on an H200 with the
    # vendored llama.cpp, CUDA0 compute = n_vocab x T x 4 + n_embd x T x 4 to 0.01 MiB on llama,
    # gemma3 and qwen3moe shapes: benchmarks/gpu_truth/results/2026-11-30-h200.md); the special
    # cases above (hybrid memories, shared KV, MLA) are not measured on a GPU and keep theirs
    special = (
        model.architecture in ("qwen35", "qwen35moe", "qwen3next") or any(r.reuse >= 0 for r in st.layers) or st.is_mla
    )
    output_gpu = output if special else model.n_vocab * n_out * f32 + TE

    devices = [host, *gpu_devices]
    result: dict[str, int] = dict.fromkeys(devices, 0)
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
            copies = max(
                (
                    l.cells * (model.n_embd_k_gqa(l.il) + model.n_embd_v_gqa(l.il)) * 2
                    for l in kv_layers
                    if not kv_f16 or l.device != dev
                ),
                default=0,
            )
            if copies and (result.get(dev) or dev == gpu_devices[0]):
                result[dev] = max(result[dev], full_mask + 4 * TE + copies)
    if gpu_devices and T >= GPU_OP_OFFLOAD_MIN_BATCH:
        # With a GPU the host buffer (CUDA_Host, pinned) holds the graph's inputs only: ggml-cuda
        # runs the large-batch matrix work of host layers on the GPU too (ggml-cuda.cu
        # ggml_backend_cuda_device_offload_op, batch >= 32), so host layers add nothing here.
        result[host] = host_inputs_bytes(
            model, n_ubatch=T, n_ctx_seq=n_ctx_seq, swa_cells=swa_cells, flash_attn=flash_attn, kv_layers=kv_layers
        )
        if rules.mixed_embd:  # the mixed-batch embeddings input and its copy (b11434 build_inp_embd)
            result[host] += 2 * TE
    elif first_dev != host:
        # the host always stages the token embeddings for the first offloaded layer
        result[host] = max(result[host], TE)
    return ComputeEstimate({d: b for d, b in result.items() if b}, "estimate")


def host_inputs_bytes(
    model: ModelProfile,
    *,
    n_ubatch: int,
    n_ctx_seq: int,
    swa_cells: int,
    flash_attn: bool,
    kv_layers: Sequence[LayerKV],
) -> int:
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
