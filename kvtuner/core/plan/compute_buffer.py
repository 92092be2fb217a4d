"""Compute buffers: the scratch memory ggml's scheduler reserves for the worst-case graph.

llama.cpp sizes them in ``llama_context::sched_reserve`` (src/llama-context.cpp) by building the
prompt-processing graph for ``n_tokens = min(n_ctx, n_ubatch)`` tokens with
``n_outputs = min(n_tokens, n_outputs_max)`` (every token in a generic context, one per slot in
llama-server b11434: :mod:`.build_rules` says which build and program a plan follows) and a full
KV cache, and letting ``ggml-alloc`` pack its tensors. The
result depends on the allocator's packing, so an analytic figure is an *estimate*; a dry-run
(``kvtuner plan --verify``) gives the exact one, which :meth:`ComputeEstimate.with_exact` records.

On the CPU alone, for the architectures whose family has reserve-graph rules
(:class:`~kvtuner.core.model.arch.GraphRules` in :mod:`kvtuner.core.model.arch`): ``llama`` (and
Mixtral-style MoE), ``deci``, ``llama4``, ``gemma2``, ``gemma3``, ``gemma3n``, ``gemma4``, ``qwen2``,
``qwen2moe``, ``qwen3``, ``qwen3moe``, ``deepseek2`` (MLA), ``glm4moe``, ``gpt-oss``, ``lfm2``,
``falcon-h1``, ``nemotron_h``, ``phi3``, ``stablelm`` and ``olmoe``, the figure is computed the way llama.cpp computes it: the reserve graph is rebuilt node by node and
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
from typing import TYPE_CHECKING, Any

from ..model.arch import family_of
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
    E = model.n_embd
    n_exp, n_used = model.n_expert, max(1, model.n_expert_used)
    dense_lead = _meta_int(model, "leading_dense_block_count", 0)
    step = _meta_int(model, "interleave_moe_layer_step", 0)
    moe = n_exp > 0 and il >= dense_lead and (step <= 0 or (il + 1) % step == 0)
    if not moe:
        return 3 * T * ff[il] * 4
    f_exp = _meta_int(model, "expert_feed_forward_length", 0) or (ff[il] // n_used if ff[il] else 0)
    shared = _meta_int(model, "expert_shared_feed_forward_length", 0)
    n_shared = _meta_int(model, "expert_shared_count", 0)
    if not shared and n_shared:
        shared = f_exp * n_shared
    if family_of(model.architecture).shared_expert_is_expert:  # llama4.cpp: the shared expert is one expert wide
        shared = f_exp
    experts = 3 * T * f_exp * n_used * 4 + T * E * n_used * 4 + 3 * T * n_exp * 4
    return max(experts, 3 * T * shared * 4) + T * E * 4 * (1 if shared else 0)


def _recurrent_bytes(model: ModelProfile, T: int, n_seq: int) -> int:
    """Peak activations of one recurrent layer for ``T`` tokens, bytes: the input projection,
    the convolution window ``(d_conv - 1 + T) x conv_dim`` and its output, the scan's output and
    final states (mamba-base.cpp ``build_mamba2_layer``, delta-net-base.cpp, lfm2.cpp)."""
    kind, E = family_of(model.architecture).recurrent_kind, model.n_embd
    d_conv = _meta_int(model, "ssm.conv_kernel", 0)
    d_inner = _meta_int(model, "ssm.inner_size", 0)
    d_state = _meta_int(model, "ssm.state_size", 0)
    n_group = _meta_int(model, "ssm.group_count", 0)
    dt_rank = _meta_int(model, "ssm.time_step_rank", 0)
    l_cache = _meta_int(model, "shortconv.l_cache", 0)
    n_rows = max(1, n_seq)
    if kind == "shortconv":  # short conv: in_proj [3E, T], conv window and output
        return 4 * (3 * E * T + E * (l_cache - 1 + T) + 2 * E * T)
    if kind == "delta_net":  # gated delta net
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
    if kind == "mamba":
        d_in_proj, conv_dim = 2 * d_inner, d_inner
    return 4 * (d_in_proj * T + conv_dim * (d_conv - 1 + T) + conv_dim * T + d_inner * T + d_state * d_inner * n_rows)


@dataclass(frozen=True)
class ComputeRequest:
    """What one compute-buffer estimate is for (:func:`estimate_compute`).

    Attributes:
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
    """

    n_ubatch: int
    n_seq: int
    n_ctx_seq: int
    swa_cells: int
    flash_attn: bool
    layer_devices: Sequence[str]
    kv_layers: Sequence[LayerKV]
    gpu_devices: Sequence[str]
    host: str
    kv_f16: bool = True
    n_stream: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    rules: BuildRules = VENDORED


def _rebuilt_on_cpu(model: ModelProfile, req: ComputeRequest) -> ComputeEstimate | None:
    """Plain transformers on the CPU alone (:func:`reserve_graph.transformer_shape` says which):
    the reserve graph rebuilt node by node and placed by a model of ggml-alloc (:mod:`.reserve_graph`,
    :mod:`.ggml_graph`), llama.cpp's figure to the byte; None for any other plan."""
    if req.gpu_devices or any(d != req.host for d in req.layer_devices):
        return None
    shape = transformer_shape(model, req.kv_layers, req.type_k, req.type_v)
    if shape is None:
        return None
    T = req.n_ubatch
    exact = transformer_reserve_bytes(
        shape,
        T,
        req.n_seq if req.n_stream is None else req.n_stream,
        req.flash_attn,
        n_seqs=req.n_seq,
        n_outputs=req.rules.n_outputs(T, req.n_seq),
        rules=req.rules,
    )
    return ComputeEstimate({req.host: exact}, "estimate")


class _PhaseWalk:
    """The reserve graph walked phase by phase (:func:`estimate_compute`): the inputs alive
    throughout, the KQ masks until their last layer, each layer's peak and the output's."""

    def __init__(self, model: ModelProfile, req: ComputeRequest) -> None:
        f32 = 4
        self.model, self.req, self.fam = model, req, family_of(model.architecture)
        st = model.structure
        T = self.T = req.n_ubatch
        self.TE = T * model.n_embd * f32
        self.ff = _per_layer_ff(model)
        self.kv_by_il = {l.il: l for l in req.kv_layers}
        mask_b = 2 if req.flash_attn else f32
        attn_layers = [r.il for r in st.layers if (r.kv or r.reuse >= 0) and not r.nextn]
        self.full_last = max((il for il in attn_layers if not (st.layers[il].swa and st.is_iswa)), default=-1)
        self.swa_last = max((il for il in attn_layers if st.layers[il].swa and st.is_iswa), default=-1)
        self.full_mask = req.n_ctx_seq * T * mask_b
        self.swa_mask = req.swa_cells * T * mask_b
        self.recurrent = self._recurrent()
        self.inputs = self._inputs()

    def _recurrent(self) -> int:
        """One recurrent layer's peak (:func:`_recurrent_bytes`); b11434's ``build_rs`` adds, beside
        ``ssm_scan``'s own state rows, one ``get_rows`` of the ``n_seq - 1`` others."""
        model, req = self.model, self.req
        recurrent = _recurrent_bytes(model, self.T, req.n_seq) if model.structure.recurrent_layers else 0
        if recurrent and req.rules.rs_gather:
            d_state, d_inner = _meta_int(model, "ssm.state_size", 0), _meta_int(model, "ssm.inner_size", 0)
            recurrent += 4 * d_state * d_inner * max(0, req.n_seq - 1)
        return recurrent

    def _inputs(self) -> int:
        """Inputs alive through every layer: token ids, positions, output ids; b11434's mixed-batch
        embeddings input and its dup (``build_inp_embd``, never freed); Gemma 3n / 4's per-layer
        embeddings ``[n_embd_per_layer x n_layer, T]``, looked up and projected once (gemma4.cpp /
        gemma3n.cpp)."""
        inputs = 4 * self.T * 4
        if self.req.rules.mixed_embd:
            inputs += 2 * self.TE
        return inputs + 2 * self.per_layer * self.model.n_layer * self.T * 4

    @property
    def per_layer(self) -> int:
        """``n_embd_per_layer`` (the family's default when the key is absent)."""
        return _meta_int(self.model, "embedding_length_per_layer_input", self.fam.per_layer_default)

    def attn_bytes(self, il: int) -> int:
        """Layer ``il``'s attention peak: Q, K, V and the output (flash attention), or on top of
        everything the layer allocated the ``n_kv x T x n_head`` f32 scores; MLA's absorbed queries
        ``[kv_lora + rope, n_head, T]``; Qwen3.5's gated query (one projection ``[2 x head_k x
        n_head, T]`` holding the query and its gate, alive until the gate multiplies the output,
        beside the normed query: qwen35.cpp / qwen3next.cpp ``build_layer_attn``)."""
        model, req, st, T, TE, f32 = self.model, self.req, self.model.structure, self.T, self.TE, 4
        r = st.layers[il]
        h = model.n_head[il] or max(model.n_head)
        q = T * h * r.head_k * f32
        kv = 0 if r.reuse >= 0 else T * model.n_head_kv[il] * (r.head_k + r.head_v) * f32
        out = T * h * r.head_v * f32
        mla = 2 * T * h * r.k_width * f32 if st.is_mla else 0
        gated = 2 * q if self.fam.gated_attention else 0
        if req.flash_attn:
            return TE + max(q + kv, q + out) + mla + gated
        # the norm, Q, K, V and their roped copies leave holes too small for the scores
        l = self.kv_by_il.get(il)
        cells = l.cells if l is not None else (req.swa_cells if (r.swa and st.is_iswa) else req.n_ctx_seq)
        return 3 * TE + q + kv + cells * T * h * f32 + mla + gated

    def layer_peak(self, il: int) -> int:
        """Layer ``il``'s peak: the residual stream, the inputs and the masks still needed, and the
        largest of its feed-forward, attention and recurrent activations (Falcon-H1: attention and
        the recurrent block side by side)."""
        r = self.model.structure.layers[il]
        if r.nextn:
            return 0
        live = self.TE + self.inputs
        if il <= self.full_last:
            live += self.full_mask
        if il <= self.swa_last:
            live += self.swa_mask
        parts = [self.TE + _ffn_bytes(self.model, il, self.T, self.ff)]
        if r.kv or r.reuse >= 0:
            parts.append(self.attn_bytes(il))
        if r.recurrent:
            parts.append(self.recurrent + (self.attn_bytes(il) if r.kv and self.fam.parallel_attention else 0))
        return live + max(parts)

    def _keeps_masks(self) -> bool:
        """The output keeps the KQ masks' holes under it: Gated-DeltaNet hybrids and shared-KV layers."""
        return self.fam.recurrent_kind == "delta_net" or any(r.reuse >= 0 for r in self.model.structure.layers)

    def output(self) -> tuple[int, int]:
        """The output phase on the host and on a GPU, bytes: logits and hidden states; inputs freed
        before it (KQ masks) leave holes the logits cannot use when other blocks were allocated
        above them (hybrid memories and shared KV layers, measured); MLA keeps its absorbed queries;
        b11434's mixed-batch embeddings input and its copy stay allocated to the end, the token
        rows set into the copy leaving a hole under them (GGML_SCHED_DEBUG dumps of qwen35 shapes:
        3 x n_embd x T x 4 bytes more than the vendored graph)."""
        model, st, T, TE, f32 = self.model, self.model.structure, self.T, self.TE, 4
        n_out = self.req.rules.n_outputs(T, self.req.n_seq)  # every token, or one per sequence (llama-server)
        output = model.n_vocab * n_out * f32 + (3 if model.n_expert and not st.is_mla else 2) * TE
        if self._keeps_masks():
            output += (self.full_mask if self.full_last >= 0 else 0) + (self.swa_mask if self.swa_last >= 0 else 0)
            output += 2 * self.per_layer * model.n_layer * T * f32
        elif self.swa_last >= 0:
            output += self.swa_mask  # the sliding-window mask's hole stays under the logits (iSWA caches, measured)
        if st.is_mla and st.kv_layers:
            output += 2 * T * max(model.n_head) * st.kv_layers[0].k_width * f32
        if self.req.rules.mixed_embd:
            output += 3 * TE
        # on a GPU backend the output phase of an ordinary transformer holds the logits and one
        # hidden state: the masks and the second state are freed by then (measured on an H200 with
        # the vendored llama.cpp, CUDA0 compute = n_vocab x T x 4 + n_embd x T x 4 to 0.01 MiB on
        # llama, gemma3 and qwen3moe shapes: benchmarks/gpu_truth/results/2026-11-30-h200.md); the
        # special cases above (hybrid memories, shared KV, MLA) are not measured on a GPU and keep theirs
        special = self._keeps_masks() or st.is_mla
        return output, (output if special else model.n_vocab * n_out * f32 + TE)

    def device_peaks(self) -> dict[str, int]:
        """Each backend's buffer: the largest phase of the layers (and the output) it runs."""
        req, n_layer = self.req, self.model.n_layer
        output_host, output_gpu = self.output()
        devices = [req.host, *req.gpu_devices]
        result: dict[str, int] = dict.fromkeys(devices, 0)
        for dev in devices:
            peak = max((self.layer_peak(il) for il in range(n_layer) if req.layer_devices[il] == dev), default=0)
            if req.layer_devices[n_layer] == dev:
                peak = max(peak, output_gpu if dev != req.host else output_host)
            result[dev] = peak
        return result


def _flash_attn_copies(model: ModelProfile, req: ComputeRequest, walk: _PhaseWalk, result: dict[str, int]) -> None:
    """Flash attention on a GPU reads K and V as f16 in its own memory: a layer whose KV is
    quantized or lives elsewhere (-nkvo, host layers run there by op offload, the tensor-override
    split) gets f16 copies of its whole K and V in the compute buffer (ggml-cuda fattn-common.cuh
    launch_fattn converts non-F16 K/V; measured: llama-2-7B shapes 168.0 MiB with -nkvo or q8_0 KV
    = mask 8 + 4 x n_embd x T x 4 + 128 MiB copies)."""
    if not (req.gpu_devices and req.flash_attn and walk.T >= GPU_OP_OFFLOAD_MIN_BATCH):
        return
    for dev in req.gpu_devices:
        copies = max(
            (
                l.cells * (model.n_embd_k_gqa(l.il) + model.n_embd_v_gqa(l.il)) * 2
                for l in req.kv_layers
                if not req.kv_f16 or l.device != dev
            ),
            default=0,
        )
        if copies and (result.get(dev) or dev == req.gpu_devices[0]):
            result[dev] = max(result[dev], walk.full_mask + 4 * walk.TE + copies)


def _host_buffer(model: ModelProfile, req: ComputeRequest, walk: _PhaseWalk, result: dict[str, int]) -> None:
    """The host's buffer with a GPU: from a batch of 32 on (ggml-cuda.cu
    ``ggml_backend_cuda_device_offload_op``) ggml-cuda runs the large-batch matrix work of host
    layers on the GPU too, so the host buffer (CUDA_Host, pinned) holds the graph's inputs only
    (:func:`host_inputs_bytes`, plus b11434's mixed-batch embeddings input and its copy); below it,
    with the first layer offloaded, the host still stages the token embeddings."""
    T, host = walk.T, req.host
    if req.gpu_devices and T >= GPU_OP_OFFLOAD_MIN_BATCH:
        result[host] = host_inputs_bytes(
            model,
            n_ubatch=T,
            n_ctx_seq=req.n_ctx_seq,
            swa_cells=req.swa_cells,
            flash_attn=req.flash_attn,
            kv_layers=req.kv_layers,
        )
        if req.rules.mixed_embd:
            result[host] += 2 * walk.TE
    elif (req.layer_devices[0] if model.n_layer else host) != host:
        result[host] = max(result[host], walk.TE)


def estimate_compute(model: ModelProfile, request: ComputeRequest | None = None, **keywords: Any) -> ComputeEstimate:
    """Estimate the compute buffer of every backend for ``request``, bytes.

    ``request`` is a :class:`ComputeRequest`; callers may pass its fields as keywords instead
    (``estimate_compute(model, n_ubatch=..., ...)``).

    Plain transformers on the CPU alone skip the phase walk (:func:`_rebuilt_on_cpu`: the reserve
    graph rebuilt node by node, llama.cpp's figure to the byte). Otherwise the reserve graph
    (llama-context.cpp ``sched_reserve``: ``n_ubatch`` tokens, every token an output, a full
    cache) is walked phase by phase (:class:`_PhaseWalk`), and each backend's buffer is the largest of:

    - a repeating layer: the residual stream, the KQ masks still needed by later layers
      (``n_kv x T``; f16 with flash attention, f32 without; the sliding-window mask for iSWA
      caches), and the largest of its attention (Q, K, V and the flash-attention output; without
      flash attention the ``n_kv x T x n_head`` f32 scores, softmax in place), feed-forward
      (:func:`_ffn_bytes`) and recurrent (:func:`_recurrent_bytes`) activations;
    - the output: the ``n_vocab x T`` f32 logits and two ``n_embd x T`` hidden states.

    then a GPU's flash-attention f16 copies (:func:`_flash_attn_copies`) and the host's buffer
    with a GPU (:func:`_host_buffer`).

    Returns:
        A :class:`ComputeEstimate` with ``source="estimate"``.

    Raises:
        TypeError: keywords that are not :class:`ComputeRequest` fields, or both forms at once.
    """
    if request is None:
        request = ComputeRequest(**keywords)
    elif keywords:
        raise TypeError("estimate_compute takes a ComputeRequest or its fields as keywords, not both")
    exact = _rebuilt_on_cpu(model, request)
    if exact is not None:
        return exact
    walk = _PhaseWalk(model, request)
    result = walk.device_peaks()
    _flash_attn_copies(model, request, walk, result)
    _host_buffer(model, request, walk, result)
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
