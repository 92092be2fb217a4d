"""vLLM's memory budget for one model on one GPU: weights, profiling peak, KV pool, blocks and
the "maximum concurrency" its startup log prints.

vLLM sizes its KV cache differently from llama.cpp: it does not take a context size, it takes a
share of the card (``--gpu-memory-utilization``, default 0.9), subtracts what a profiling forward
pass of ``max_num_batched_tokens`` tokens used (weights, the PyTorch activation peak, memory
outside PyTorch) and cuts the rest into paged blocks of 16 tokens. Formulas, by vLLM version:

- **Budget** (v0, ``vllm/worker/worker.py`` ``Worker.determine_num_available_blocks``, v0.6.4 -
  v0.8): ``available_kv_cache_memory = total_gpu_memory x gpu_memory_utilization - peak_memory``
  with ``peak_memory = weights + torch activation peak + non_torch_memory`` (the log line
  "model weights take X; non_torch_memory takes Y; PyTorch activation peak memory takes Z; the
  rest of the memory reserved for KV Cache is W", or in v0.6.4 "peak_torch_memory=..,
  non_torch_memory=.., kv_cache_size=.."). v1 (``vllm/v1/worker/gpu_worker.py``
  ``Worker.determine_available_memory``, v0.8 - v0.11) does the same subtraction and logs
  "Available KV cache memory: W GiB".
- **Block bytes** (v0 ``vllm/worker/cache_engine.py`` ``CacheEngine.get_cache_block_size``;
  v1 ``vllm/v1/kv_cache_interface.py`` ``AttentionSpec.page_size_bytes`` x layers):
  ``block_size x num_attention_layers x 2 x num_kv_heads x head_size x dtype_size``; the default
  ``block_size`` is 16 (``vllm/config.py`` ``CacheConfig``); ``--kv-cache-dtype fp8`` stores 1
  byte per element, ``auto`` the model dtype (2 bytes for bf16/fp16).
- **Blocks**: v0 ``num_gpu_blocks = int(available_kv_cache_memory // cache_block_size)``; v1
  ``kv_cache_utils.py`` ``num_blocks = int(available_memory // page_size // num_layers)`` (the
  same number), logged as "# GPU blocks: N" (v0, and v1 up to v0.8) or
  "GPU KV cache size: N x 16 tokens" (v1 from v0.8).
- **Maximum concurrency**: v0 ``executor_base.py`` ``num_gpu_blocks x block_size /
  max_model_len``; v1 ``kv_cache_utils.py`` ``get_max_concurrency_for_kv_cache_config``
  ``num_blocks / cdiv(max_model_len, block_size)`` (equal when ``max_model_len`` is a multiple
  of 16).

- **What the profiling pass costs**, by version: v0.6.4 and later subtract PyTorch's
  *allocated* peak plus the memory outside PyTorch (:func:`estimate_activation_bytes`, derived
  from the tensors alive at ``down_proj``); v0.3.x subtracts ``total - free`` after the pass,
  i.e. every segment PyTorch *reserved* (:func:`reserved_profile_bytes`, replaying the weights
  and one forward through :mod:`~kvtuner.core.plan.torch_allocator`) plus the CUDA context
  (``VllmSettings.memory_profiling``).
- **GPTQ weights** (:meth:`VllmModel.weight_tensors`): vLLM's own tensors for a checkpoint whose
  ``config.json`` has a GPTQ ``quantization_config``.
- **Multimodal models**: vLLM's profiling pass also runs the vision encoder on dummy images;
  kvtuner does not model it and gives no blocks (:data:`MULTIMODAL_UNKNOWN`).

The profiling peak is measured by vLLM at start-up; kvtuner estimates it and says so. ``benchmarks/vllm_logs/`` checks both halves
against public logs: the pool and block arithmetic (from the logged budget) and the full
prediction (from the card's memory and our estimates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..units import GiB
from .torch_allocator import CachingAllocatorModel

#: vLLM's default KV block size in tokens (``vllm/config.py`` ``CacheConfig.block_size``
#: default 16 on CUDA, every version from v0.2 to v0.11).
VLLM_BLOCK_SIZE = 16
#: ``--gpu-memory-utilization`` default (``vllm/engine/arg_utils.py`` ``EngineArgs``).
VLLM_GPU_MEMORY_UTILIZATION = 0.9
#: ``--max-num-seqs`` default (``EngineArgs.max_num_seqs`` 256).
VLLM_MAX_NUM_SEQS = 256
#: Bytes per KV element for ``--kv-cache-dtype`` (``vllm/utils.py`` ``STR_DTYPE_TO_TORCH_DTYPE``;
#: fp8 variants are 1-byte torch.uint8 / float8 storage). ``auto``: the model dtype.
KV_DTYPE_BYTES: dict[str, int] = {
    "auto": 2,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float32": 4,
}
#: llama.cpp KV cache types and the vLLM ``--kv-cache-dtype`` that stores as few bytes
#: (q8_0 is 8.5 bits in llama.cpp; vLLM's nearest is fp8, 8 bits).
LLAMA_TO_VLLM_KV: dict[str, str] = {
    "f16": "auto",
    "bf16": "auto",
    "f32": "float32",
    "q8_0": "fp8",
    "q5_0": "fp8",
    "q5_1": "fp8",
    "q4_0": "fp8",
    "q4_1": "fp8",
    "iq4_nl": "fp8",
}
#: Memory outside PyTorch's allocator on one GPU (CUDA context is not counted: vLLM measures from
#: after it; NCCL, cuBLAS workspaces): the logged ``non_torch_memory`` was 0.35 GiB on an RTX 3090
#: (vllm-project/vllm#10517, v0.6.4), 0.16 GiB on an H100 (vllm-project/vllm#12126), 0.20 GiB
#: (vllm-project/vllm#14447). kvtuner takes 0.35 GiB (the larger single-GPU figure).
DEFAULT_NON_TORCH_BYTES = int(0.35 * GiB)
#: Bytes per activation element in the profiling pass (bf16/fp16 model dtype).
ACTIVATION_BYTES = 2


class VllmError(ValueError):
    """A vLLM setting or model that cannot be planned; the message says what to change."""


@dataclass(frozen=True)
class VllmModel:
    """The fields of a model vLLM's memory planning depends on (HF ``config.json`` names in brackets).

    Attributes:
        name: display name.
        n_layer: attention layers holding KV (``num_hidden_layers``).
        n_kv_head: KV heads per layer (``num_key_value_heads``).
        head_dim: head size (``head_dim``, else ``hidden_size / num_attention_heads``).
        n_embd: hidden size (``hidden_size``).
        n_ff: MLP intermediate size (``intermediate_size``).
        n_vocab: vocabulary (``vocab_size``).
        n_params: parameter count (from the GGUF tensors, or estimated from ``config.json``).
        weight_bytes_per_param: bytes per weight as vLLM loads it (2: a bf16/fp16 checkpoint).
        n_head: query heads (``num_attention_heads``; 0 when unknown: no per-tensor layout).
        qkv_bias: q/k/v projections carry a bias (Qwen2: ``model_type`` qwen2).
        gptq: the checkpoint's GPTQ quantization (``quantization_config`` with ``quant_method``
            gptq), None for a bf16/fp16 checkpoint.
        multimodal: the ``model_type`` of a vision-language checkpoint (e.g. ``mllama``), "" for
            a text model. vLLM profiles its vision encoder too; kvtuner does not model that.
        tied_embeddings: ``tie_word_embeddings`` (no separate lm_head tensor).
    """

    name: str
    n_layer: int
    n_kv_head: int
    head_dim: int
    n_embd: int
    n_ff: int
    n_vocab: int
    n_params: int
    weight_bytes_per_param: float = 2.0
    n_head: int = 0
    qkv_bias: bool = False
    gptq: GptqConfig | None = None
    multimodal: str = ""
    tied_embeddings: bool = False

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> int:
        """K and V bytes one token takes in every layer: ``2 x n_layer x n_kv_head x head_dim x
        dtype bytes`` (per-token share of ``CacheEngine.get_cache_block_size``).

        Raises:
            VllmError: an unknown ``kv_cache_dtype``.
        """
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * kv_dtype_bytes(kv_cache_dtype)

    def block_bytes(self, kv_cache_dtype: str = "auto", block_size: int = VLLM_BLOCK_SIZE) -> int:
        """Bytes of one KV block across all layers: ``block_size x kv_bytes_per_token``."""
        return block_size * self.kv_bytes_per_token(kv_cache_dtype)

    @property
    def weights_bytes(self) -> int:
        """Weights as vLLM holds them, bytes: the sum of :meth:`weight_tensors` for a GPTQ
        checkpoint, else ``n_params x weight_bytes_per_param``."""
        if self.gptq is not None and self.n_head:
            return sum(b for _, b in self.weight_tensors())
        return int(self.n_params * self.weight_bytes_per_param)

    @property
    def vocab_padded(self) -> int:
        """Rows of the embedding and lm_head as vLLM allocates them: ``vocab_size`` rounded up to
        a multiple of 64 (``vllm/model_executor/layers/vocab_parallel_embedding.py``
        ``pad_vocab_size``, ``DEFAULT_VOCAB_PADDING_SIZE = 64``, v0.3 - v0.11)."""
        return -(-self.n_vocab // 64) * 64

    def linears(self) -> list[tuple[str, int, int, bool]]:
        """One decoder layer's linear layers as vLLM fuses them, ``(name, in_features,
        out_features, has_bias)``: ``qkv_proj`` (E -> (H + 2 Hkv) d, ``QKVParallelLinear``),
        ``o_proj`` (H d -> E), ``gate_up_proj`` (E -> 2 F, ``MergedColumnParallelLinear``),
        ``down_proj`` (F -> E) (``vllm/model_executor/models/llama.py`` / ``qwen2.py``, v0.3).

        Raises:
            VllmError: ``n_head`` or ``n_ff`` unknown (a model from a GGUF without them).
        """
        if not self.n_head or not self.n_ff:
            raise VllmError("the per-tensor layout needs num_attention_heads and intermediate_size: give --hf-config")
        d, e = self.head_dim, self.n_embd
        return [
            ("qkv_proj", e, (self.n_head + 2 * self.n_kv_head) * d, self.qkv_bias),
            ("o_proj", self.n_head * d, e, False),
            ("gate_up_proj", e, 2 * self.n_ff, False),
            ("down_proj", self.n_ff, e, False),
        ]

    def weight_tensors(self) -> list[tuple[str, int]]:
        """Every weight tensor vLLM allocates on the GPU, ``(name, bytes)``, in the order the
        model's ``__init__`` creates them (``embed_tokens``; per layer the four linears, then
        ``input_layernorm`` and ``post_attention_layernorm``; ``norm``; ``lm_head`` unless tied).

        Dtype bytes: ``weight_bytes_per_param`` (2 for fp16/bf16). A GPTQ linear holds, from
        ``GPTQLinearMethod.create_weights`` (``vllm/model_executor/layers/quantization/gptq.py``,
        v0.3.0): ``qweight`` int32 ``[in / (32 / bits), out]``, ``g_idx`` int32 ``[in]`` (created
        whatever ``desc_act`` is), ``qzeros`` int32 ``[in / group_size, out / (32 / bits)]``,
        ``scales`` fp16 ``[in / group_size, out]``; the bias (``ColumnParallelLinear``) stays
        fp16. Embeddings, lm_head and norms are not quantized (``ParallelLMHead`` /
        ``VocabParallelEmbedding`` / ``RMSNorm`` take no ``linear_method``). The rotary
        cos/sin cache (one ``max_position x head_dim`` fp16 buffer, 8 MiB for 32K positions)
        is not counted.

        Raises:
            VllmError: see :meth:`linears`.
        """
        b = int(self.weight_bytes_per_param)
        out: list[tuple[str, int]] = [("embed_tokens", self.vocab_padded * self.n_embd * b)]
        for il in range(self.n_layer):
            for name, n_in, n_out, bias in self.linears():
                tag = f"layers.{il}.{name}"
                q = self.gptq
                if q is not None:
                    pack = 32 // q.bits
                    groups = n_in // q.group_size if q.group_size > 0 else 1
                    out += [
                        (tag + ".qweight", n_in // pack * n_out * 4),
                        (tag + ".g_idx", n_in * 4),
                        (tag + ".qzeros", groups * (n_out // pack) * 4),
                        (tag + ".scales", groups * n_out * 2),
                    ]
                else:
                    out.append((tag + ".weight", n_in * n_out * b))
                if bias:
                    out.append((tag + ".bias", n_out * b))
            out += [
                (f"layers.{il}.input_layernorm", self.n_embd * b),
                (f"layers.{il}.post_attention_layernorm", self.n_embd * b),
            ]
        out.append(("norm", self.n_embd * b))
        if not self.tied_embeddings:
            out.append(("lm_head", self.vocab_padded * self.n_embd * b))
        return out

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str = "") -> VllmModel:
        """Read an HF ``config.json`` (a multimodal one's ``text_config`` is used when present,
        and the model is marked :attr:`multimodal`). A ``quantization_config`` with
        ``quant_method`` gptq (what vLLM's ``get_quant_config`` reads first,
        ``vllm/model_executor/weight_utils.py`` v0.3.0) sets :attr:`gptq`.

        The parameter count, when the config has none, is counted from the shapes of a
        Llama-style decoder: embeddings ``V x E`` (twice unless ``tie_word_embeddings``), per
        layer ``E x (H + 2 Hkv) x d + H d x E`` attention and ``3 x E x F`` gated MLP
        (transformers ``LlamaForCausalLM``), plus the bias of Qwen2's q/k/v projections.

        Raises:
            VllmError: a required field is missing or not a positive whole number.
        """
        c = dict(cfg.get("text_config") or cfg)

        def need(key: str, *alts: str) -> int:
            for k in (key, *alts):
                v = c.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    return v
            raise VllmError(f"config.json: '{key}' is missing or not a positive whole number")

        n_layer = need("num_hidden_layers", "n_layer", "num_layers")
        n_embd = need("hidden_size", "n_embd", "d_model")
        n_head = need("num_attention_heads", "n_head")
        n_kv = c.get("num_key_value_heads") or n_head
        head_dim = c.get("head_dim") or n_embd // n_head
        n_ff = need("intermediate_size", "ffn_hidden_size")
        n_vocab = need("vocab_size")
        n_params = cfg.get("num_parameters") or c.get("num_parameters")
        if not n_params:
            attn = n_embd * (n_head + 2 * n_kv) * head_dim + n_head * head_dim * n_embd
            if c.get("model_type") in ("qwen2",):
                attn += (n_head + 2 * n_kv) * head_dim
            per_layer = attn + 3 * n_embd * n_ff + 2 * n_embd
            emb = n_vocab * n_embd * (1 if c.get("tie_word_embeddings") else 2)
            n_params = n_layer * per_layer + emb + n_embd
        dtype = str(c.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16")
        wbytes = 4.0 if dtype == "float32" else 2.0
        gptq = GptqConfig.from_hf(cfg.get("quantization_config") or c.get("quantization_config"))
        mm = ""
        if cfg.get("vision_config") or cfg.get("text_config") or cfg.get("model_type") in MULTIMODAL_MODEL_TYPES:
            mm = str(cfg.get("model_type") or "multimodal")
        return cls(
            name or str(c.get("_name_or_path") or cfg.get("_name_or_path") or c.get("model_type") or "model"),
            n_layer,
            int(n_kv),
            int(head_dim),
            n_embd,
            n_ff,
            n_vocab,
            int(n_params),
            wbytes,
            n_head=n_head,
            qkv_bias=c.get("model_type") in ("qwen2",),
            gptq=gptq,
            multimodal=mm,
            tied_embeddings=bool(c.get("tie_word_embeddings")),
        )

    @classmethod
    def from_profile(cls, profile: Any) -> VllmModel:
        """From a GGUF :class:`~kvtuner.core.model.profile.ModelProfile`: the same architecture as
        vLLM would load it from the original bf16 checkpoint (2 bytes per parameter; the GGUF's
        quantization is not what vLLM holds). Sliding-window layers count as full layers (vLLM's
        v0 cache engine allocates them in full; v1's hybrid allocator, v0.10+, gives them fewer
        blocks, so the pool of a Gemma-style model is then underestimated).

        Raises:
            VllmError: a model without attention KV (recurrent only) or with MLA (vLLM caches
                MLA's latent, not K and V; not planned here).
        """
        if profile.is_mla:
            raise VllmError(
                "MLA models (DeepSeek-style) keep a latent KV in vLLM: kvtuner plans vLLM only for MHA/GQA models"
            )
        kv_layers = [il for il in range(profile.n_layer) if profile.has_kv(il) and profile.n_embd_k_gqa(il)]
        if not kv_layers:
            raise VllmError("this model has no attention KV cache to plan in vLLM")
        n_kv = max(profile.n_head_kv[il] for il in kv_layers)
        arch = profile.architecture
        n_ff = profile.metadata.get(f"{arch}.feed_forward_length", 0)
        if isinstance(n_ff, (list, tuple)):
            n_ff = max(n_ff) if n_ff else 0
        return cls(
            profile.name or profile.file_name,
            len(kv_layers),
            int(n_kv),
            int(profile.head_dim_k),
            int(profile.n_embd),
            int(n_ff or 0),
            int(profile.n_vocab),
            int(profile.n_params),
            2.0,
        )


#: ``model_type`` values of vision-language checkpoints vLLM profiles with dummy images
#: (``vllm/multimodal``); a ``config.json`` with a ``vision_config`` or ``text_config`` counts too.
MULTIMODAL_MODEL_TYPES = frozenset(
    {
        "mllama",
        "llava",
        "llava_next",
        "qwen2_vl",
        "qwen2_5_vl",
        "pixtral",
        "gemma3",
        "idefics3",
        "paligemma",
        "chameleon",
        "internvl_chat",
        "phi3_v",
        "minicpmv",
    }
)


@dataclass(frozen=True)
class GptqConfig:
    """A GPTQ checkpoint's quantization (``quantization_config`` / ``quantize_config.json``
    fields, read by vLLM's ``GPTQConfig.from_config``, ``vllm/model_executor/layers/quantization/
    gptq.py`` v0.3.0).

    Attributes:
        bits: ``bits`` (4 in vLLM v0.3.0, which refuses others; 2 and 8 load from v0.4, packed
            ``32 / bits`` to an int32 the same way; 3-bit packing is not planned).
        group_size: ``group_size`` (-1: one group per input row).
        desc_act: ``desc_act`` (act-order; vLLM v0.3 creates ``g_idx`` either way).
    """

    bits: int = 4
    group_size: int = 128
    desc_act: bool = False

    @classmethod
    def from_hf(cls, qc: Any) -> GptqConfig | None:
        """From a ``quantization_config`` mapping; None when absent or not GPTQ.

        Raises:
            VllmError: ``bits`` other than 2, 4 or 8.
        """
        if not isinstance(qc, Mapping) or str(qc.get("quant_method", "")).lower() != "gptq":
            return None
        bits = qc.get("bits", 4)
        if bits not in (2, 4, 8):
            raise VllmError(f"config.json: kvtuner sizes GPTQ checkpoints of 2, 4 or 8 bits, not {bits!r}")
        group = qc.get("group_size", 128)
        return cls(int(bits), int(group) if isinstance(group, int) else 128, bool(qc.get("desc_act", False)))


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per KV element of a ``--kv-cache-dtype`` value (:data:`KV_DTYPE_BYTES`).

    Raises:
        VllmError: an unknown name.
    """
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        raise VllmError(
            f"--kv-cache-dtype must be one of {', '.join(KV_DTYPE_BYTES)}, not '{kv_cache_dtype}'"
        ) from None


@dataclass(frozen=True)
class VllmSettings:
    """vLLM engine arguments that set the memory budget (``vllm serve`` flag names).

    Attributes:
        max_model_len: ``--max-model-len`` tokens per request (prompt + output).
        gpu_memory_utilization: ``--gpu-memory-utilization`` share of the card (0-1].
        max_num_seqs: ``--max-num-seqs`` sequences in one batch.
        max_num_batched_tokens: ``--max-num-batched-tokens``; None: the engine's default
            (:meth:`batched_tokens`).
        kv_cache_dtype: ``--kv-cache-dtype`` (``auto`` or ``fp8``).
        block_size: ``--block-size`` tokens per KV block.
        enable_prefix_caching: ``--enable-prefix-caching`` (default on in the v1 engine).
        engine: ``v1`` (vLLM >= 0.8 default) or ``v0``.
        enforce_eager: ``--enforce-eager`` (no CUDA graphs).
        memory_profiling: what vLLM subtracts from the budget after its profiling pass:
            ``torch_peak`` (v0.6.4 and later: PyTorch's allocated peak plus the memory outside
            PyTorch, ``Worker.determine_num_available_blocks`` / ``determine_available_memory``)
            or ``mem_get_info`` (v0.3.x: ``peak_memory = total_gpu_memory - free_gpu_memory``
            after ``profile_run`` in ``Worker.profile_num_available_blocks``, v0.3.0 wheel: every
            segment PyTorch reserved, :func:`reserved_profile_bytes`, plus the CUDA context).
            vLLM v0.2.4 subtracted ``torch.cuda.max_memory_allocated()`` alone (no non-torch
            term); that version is not modelled separately.
    """

    max_model_len: int
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int = VLLM_BLOCK_SIZE
    enable_prefix_caching: bool = True
    engine: str = "v1"
    enforce_eager: bool = False
    memory_profiling: str = "torch_peak"

    def __post_init__(self) -> None:
        if self.memory_profiling not in ("torch_peak", "mem_get_info"):
            raise VllmError(f"vLLM memory profiling must be torch_peak or mem_get_info, not '{self.memory_profiling}'")
        if self.max_model_len <= 0:
            raise VllmError(f"--max-model-len must be a positive number of tokens, not {self.max_model_len}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise VllmError(f"--gpu-memory-utilization must be in (0, 1], not {self.gpu_memory_utilization}")
        if self.max_num_seqs <= 0:
            raise VllmError(f"--max-num-seqs must be 1 or more, not {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens <= 0:
            raise VllmError(f"--max-num-batched-tokens must be 1 or more, not {self.max_num_batched_tokens}")
        if self.block_size not in (1, 8, 16, 32, 64, 128):
            raise VllmError(f"--block-size must be one of 8, 16, 32, 64, 128, not {self.block_size}")
        if self.engine not in ("v0", "v1"):
            raise VllmError(f"vLLM engine must be v0 or v1, not '{self.engine}'")
        kv_dtype_bytes(self.kv_cache_dtype)

    def batched_tokens(self, total_bytes: int | None = None, gpu_name: str = "") -> int:
        """Tokens of the profiling forward pass: ``--max-num-batched-tokens`` if given; v1
        (chunked prefill always on), for ``vllm serve``: 2048, or 8192 on a GPU of 70 GiB or more
        that is not an A100 (``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``,
        v0.9 - v0.11; ``_set_default_args_v1`` in v0.8 had 2048 for every card); v0 without
        chunked prefill: ``max(max_model_len, 2048)`` (``vllm/config.py``
        ``SchedulerConfig.__post_init__``), v0 with ``max_model_len`` above 32K turns chunked
        prefill on with 512 (v0.6.x)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.engine == "v1":
            big = total_bytes is not None and total_bytes >= 70 * GiB and "a100" not in gpu_name.lower()
            return 8192 if big else 2048
        return 512 if self.max_model_len > 32768 else max(self.max_model_len, 2048)


def estimate_activation_bytes(model: VllmModel, n_tokens: int) -> int:
    """vLLM's "PyTorch activation peak memory" (the allocated peak above the weights) for a
    profiling pass of ``n_tokens`` tokens: ``n_tokens x (3 x n_ff + 3 x n_embd) x 2`` bytes, plus
    ``n_ff x n_embd x 2`` for a GPTQ model.

    Derived from the tensors alive when ``down_proj`` runs in the last decoder layer
    (``LlamaMLP.forward`` / ``Qwen2MLP.forward``: ``gate_up, _ = self.gate_up_proj(x);
    x = self.act_fn(gate_up); x, _ = self.down_proj(x)``, vLLM v0.3 - v0.11): the layer's
    residual (E), the MLP input the decoder layer still holds (E), ``gate_up`` (2 F, still bound),
    the activation output (F) and the ``down_proj`` output (E), 2 bytes each (bf16/fp16). Every
    other moment of the layer holds less (attention: 2 E + q/k/v + 2 E). A GPTQ ``down_proj``
    adds the exllama kernel's dequantized weight, ``temp_dq`` ``[in, out]`` fp16
    (``gptq_gemm`` in ``csrc/quantization/gptq/q_gemm.cu``, v0.3.0). It matches
    vllm-project/vllm#10517 (Llama-3.1-8B, RTX 3090, v0.6.4: 2.06 GiB here against 2.071 GiB
    logged at 20000 tokens, 2.99 against 2.991 at 29000). Not in it: the sampler (smaller), vision
    encoders (multimodal profiling), MoE kernels' workspaces.
    """
    n_ff = model.n_ff or 4 * model.n_embd
    extra = n_ff * model.n_embd * ACTIVATION_BYTES if model.gptq is not None else 0
    return n_tokens * (3 * n_ff + 3 * model.n_embd) * ACTIVATION_BYTES + extra


def _linear_events(
    a: CachingAllocatorModel, model: VllmModel, out_tag: str, n_tokens: int, n_in: int, n_out: int, bias: bool
) -> None:
    """One linear layer's allocations: the output; a GPTQ layer's ``temp_dq`` (allocated after
    the output, freed on return, ``gptq_gemm`` v0.3.0); with a bias ``output + bias``, a second
    output (``GPTQLinearMethod.apply_weights`` v0.3.0; an unquantized layer fuses the bias into
    ``F.linear``)."""
    b = ACTIVATION_BYTES
    a.malloc(out_tag, n_tokens * n_out * b)
    if model.gptq is not None:
        a.malloc("temp_dq", n_in * n_out * b)
        a.free("temp_dq")
        if bias:
            a.malloc(out_tag + "+bias", n_tokens * n_out * b)
            a.free(out_tag)
            a.rename(out_tag + "+bias", out_tag)


def reserved_profile_bytes(model: VllmModel, n_tokens: int, max_num_seqs: int = VLLM_MAX_NUM_SEQS) -> tuple[int, int]:
    """``(weights_reserved, activation_reserved)`` bytes as the driver sees them after vLLM
    v0.3's profiling pass: the weights and one forward of ``n_tokens`` tokens over
    ``min(max_num_seqs, n_tokens)`` sequences replayed through PyTorch's caching allocator
    (:class:`~kvtuner.core.plan.torch_allocator.CachingAllocatorModel`); activation = the
    reserved peak minus the weights' segments.

    The events follow vLLM v0.3.0's code: weights in :meth:`VllmModel.weight_tensors` order;
    ``ModelRunner._prepare_prompt`` input ids and positions (int64); ``embed_tokens``; per
    decoder layer (``Qwen2DecoderLayer`` / ``LlamaDecoderLayer``): the first layer's
    ``input_layernorm`` output (later layers normalise in place, ``fused_add_rms_norm``),
    ``qkv_proj`` (:func:`_linear_events`), the attention output (xformers
    ``memory_efficient_attention_forward``, ``[T, H d]``), ``o_proj``, then ``gate_up_proj``,
    the activation and ``down_proj``, each freed where its Python variable is dropped; the
    sampler (``vllm/model_executor/layers/sampler.py``: logits ``[S, V]`` at the model dtype,
    the top-k/top-p sort values and int64 indices, softmax, cumsum, masks, the inverse
    permutation, then fp32 probs and logprobs and the multinomial copy with its exponential
    noise), ``S`` = sampled sequences.

    Raises:
        VllmError: see :meth:`VllmModel.linears`.
    """
    a = CachingAllocatorModel()
    for tag, n in model.weight_tensors():
        a.malloc("w:" + tag, n)
    weights = a.reserved_bytes
    t, e, b = n_tokens, model.n_embd, ACTIVATION_BYTES
    lin = {name: (n_in, n_out, bias) for name, n_in, n_out, bias in model.linears()}
    a.malloc("input_ids", t * 8)
    a.malloc("positions", t * 8)
    a.malloc("residual", t * e * b)  # embed_tokens output, the residual stream from layer 0 on
    for il in range(model.n_layer):
        if il == 0:
            a.malloc("x", t * e * b)  # input_layernorm(hidden_states) with residual None
        _linear_events(a, model, "qkv", t, *lin["qkv_proj"])
        a.malloc("attn", t * model.n_head * model.head_dim * b)
        _linear_events(a, model, "o", t, *lin["o_proj"])
        a.free("attn")
        a.free("qkv")
        a.free("x")  # the decoder layer rebinds hidden_states to the o_proj output
        a.rename("o", "x")
        _linear_events(a, model, "gate_up", t, *lin["gate_up_proj"])
        a.malloc("act", t * model.n_ff * b)
        _linear_events(a, model, "down", t, *lin["down_proj"])
        a.free("gate_up")
        a.free("act")
        a.free("x")
        a.rename("down", "x")
    seqs, v = min(max_num_seqs, n_tokens), model.vocab_padded
    sv = seqs * v
    for tag, n in (
        ("pruned", seqs * e * b),
        ("logits", sv * b),
        ("sort", sv * b),
        ("sort_idx", sv * 8),
        ("topk_mask", sv),
        ("probs_sort", sv * b),
        ("probs_sum", sv * b),
        ("topp_mask", sv),
        ("idx_inv", sv * 8),
        ("logits2", sv * b),
    ):
        a.malloc(tag, n)
    for tag in ("topk_mask", "probs_sort", "probs_sum", "topp_mask", "idx_inv", "sort", "sort_idx", "logits"):
        a.free(tag)
    for tag, n in (("probs", sv * 4), ("logprobs", sv * 4), ("probs_sel", sv * 4), ("q", sv * 4)):
        a.malloc(tag, n)
    return weights, a.peak_reserved_bytes - weights


@dataclass(frozen=True)
class VllmPlan:
    """vLLM's budget on one GPU, with where each figure came from.

    Attributes:
        total_bytes: the card's memory as vLLM sees it (``total_gpu_memory``).
        usable_bytes: ``total_bytes x gpu_memory_utilization``.
        weights_bytes, activation_bytes, non_torch_bytes: the profiled components.
        available_kv_bytes: ``usable - weights - activation - non_torch`` (0 when negative);
            None when :attr:`unknown` (also for the three below).
        block_bytes: one block (``block_size`` tokens, all layers).
        num_blocks: ``available_kv_bytes // block_bytes``.
        kv_tokens: ``num_blocks x block_size`` ("GPU KV cache size: N tokens").
        max_concurrency: requests of ``max_model_len`` tokens the pool holds at once.
        unknown: why the pool cannot be predicted ("" when it can): a multimodal model, whose
            vision-encoder profiling is not modelled.
        sources: per component, ``logged`` or ``estimated``.
        notes: what the figures do not include.
        batched_tokens: tokens of the profiling pass the activation figure is for.
    """

    settings: VllmSettings
    model: VllmModel
    total_bytes: int
    usable_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    available_kv_bytes: int | None
    block_bytes: int
    num_blocks: int | None
    kv_tokens: int | None
    max_concurrency: float | None
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    batched_tokens: int = 0
    unknown: str = ""

    @property
    def fits(self) -> bool | None:
        """Whether one request of ``max_model_len`` tokens fits (vLLM refuses to start otherwise:
        "The model's max seq len is larger than the maximum number of tokens that can be stored
        in KV cache"); None when :attr:`unknown`."""
        if self.kv_tokens is None:
            return None
        return self.kv_tokens >= self.settings.max_model_len

    def to_dict(self) -> dict[str, Any]:
        """JSON-able figures (bytes, tokens)."""
        return {
            "total_bytes": self.total_bytes,
            "usable_bytes": self.usable_bytes,
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "available_kv_bytes": self.available_kv_bytes,
            "block_bytes": self.block_bytes,
            "num_blocks": self.num_blocks,
            "kv_tokens": self.kv_tokens,
            "max_concurrency": None if self.max_concurrency is None else round(self.max_concurrency, 4),
            "fits": self.fits,
            "sources": dict(self.sources),
            "batched_tokens": self.batched_tokens,
            "unknown": self.unknown,
            "notes": list(self.notes),
        }


def pool_from_available(
    model: VllmModel, settings: VllmSettings, available_kv_bytes: int
) -> tuple[int, int, int, float]:
    """vLLM's block arithmetic from a KV budget: ``(block_bytes, num_blocks, kv_tokens,
    max_concurrency)``; see the module docstring for the source of each formula."""
    block = model.block_bytes(settings.kv_cache_dtype, settings.block_size)
    blocks = max(int(available_kv_bytes // block), 0)
    tokens = blocks * settings.block_size
    if settings.engine == "v0":
        conc = tokens / settings.max_model_len
    else:
        conc = blocks / math.ceil(settings.max_model_len / settings.block_size)
    return block, blocks, tokens, conc


#: What the plan says instead of blocks for a multimodal model.
MULTIMODAL_UNKNOWN = (
    "vision encoder not modelled: blocks unknown (vLLM's profiling pass also runs the vision "
    "encoder on max_num_seqs dummy images at the largest size, which kvtuner does not size)"
)


def plan_vllm(
    model: VllmModel,
    settings: VllmSettings,
    total_bytes: int,
    *,
    weights_bytes: int | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    gpu_name: str = "",
) -> VllmPlan:
    """Plan vLLM's KV pool on one GPU of ``total_bytes``.

    Components given (e.g. from a log) are used as they are; the others are estimated: weights
    :attr:`VllmModel.weights_bytes` (exact for a GPTQ checkpoint), the activation peak by
    :func:`estimate_activation_bytes` at :meth:`VllmSettings.batched_tokens` (for this card,
    ``gpu_name``), non-torch memory :data:`DEFAULT_NON_TORCH_BYTES`. With
    ``memory_profiling="mem_get_info"`` (vLLM v0.3.x) the weights and activation are the
    segments PyTorch reserves for them (:func:`reserved_profile_bytes`) when the model's
    per-tensor layout is known. A multimodal model without a given activation gets no blocks:
    :attr:`VllmPlan.unknown` says why.

    Raises:
        VllmError: ``total_bytes`` not positive.
    """
    if total_bytes <= 0:
        raise VllmError("the GPU's memory must be positive: give --gpu NAME or --gpu-mem SIZE")
    sources = {
        "weights": "logged" if weights_bytes is not None else "estimated",
        "activation": "logged" if activation_bytes is not None else "estimated",
        "non_torch": "logged" if non_torch_bytes is not None else "estimated",
    }
    n_tokens = settings.batched_tokens(total_bytes, gpu_name)
    w = model.weights_bytes if weights_bytes is None else int(weights_bytes)
    a = estimate_activation_bytes(model, n_tokens) if activation_bytes is None else int(activation_bytes)
    reserved_note = ""
    if (
        settings.memory_profiling == "mem_get_info"
        and model.n_head
        and model.n_ff
        and (weights_bytes is None or activation_bytes is None)
    ):
        w_res, a_res = reserved_profile_bytes(model, n_tokens, settings.max_num_seqs)
        if weights_bytes is None:
            w, sources["weights"] = w_res, "estimated (reserved segments)"
        if activation_bytes is None:
            a, sources["activation"] = a_res, "estimated (reserved segments)"
        reserved_note = (
            "vLLM v0.3 subtracts total - free memory after profiling: the weights and the activation "
            "peak are PyTorch's reserved segments, replayed through its caching allocator"
        )
    n = DEFAULT_NON_TORCH_BYTES if non_torch_bytes is None else int(non_torch_bytes)
    usable = int(total_bytes * settings.gpu_memory_utilization)
    block = model.block_bytes(settings.kv_cache_dtype, settings.block_size)
    graphs = (
        "CUDA graphs are captured after the KV pool is sized: their memory (typically 0.1-1 GiB) comes on top "
        "of --gpu-memory-utilization"
        if not settings.enforce_eager
        else ""
    )
    if model.multimodal and activation_bytes is None:
        sources["activation"] = "unknown"
        notes = [f"{model.multimodal}: {MULTIMODAL_UNKNOWN}", graphs]
        return VllmPlan(
            settings,
            model,
            int(total_bytes),
            usable,
            w,
            a,
            n,
            None,
            block,
            None,
            None,
            None,
            sources,
            tuple(x for x in notes if x),
            n_tokens,
            MULTIMODAL_UNKNOWN,
        )
    avail = max(usable - w - a - n, 0)
    block, blocks, tokens, conc = pool_from_available(model, settings, avail)
    notes = [
        graphs,
        reserved_note,
        "vLLM measures the activation peak at start-up; kvtuner's figure is an estimate"
        if sources["activation"] != "logged"
        else "",
    ]
    return VllmPlan(
        settings,
        model,
        int(total_bytes),
        usable,
        w,
        a,
        n,
        avail,
        block,
        blocks,
        tokens,
        conc,
        sources,
        tuple(x for x in notes if x),
        n_tokens,
    )


#: Share of a card's nominal memory that CUDA reports as ``total_gpu_memory`` (the driver keeps
#: the rest): 23.58 GiB of an RTX 3090's 24 (vllm-project/vllm#10517), 79.22 GiB of an H100's 80
#: (vllm-project/vllm#12126); kvtuner takes 0.985, between the two.
CUDA_REPORTED_FRACTION = 0.985


def cuda_reported_total(nominal_bytes: int) -> int:
    """``total_gpu_memory`` vLLM will see on a card of ``nominal_bytes``:
    ``nominal x CUDA_REPORTED_FRACTION`` bytes."""
    return int(nominal_bytes * CUDA_REPORTED_FRACTION)
