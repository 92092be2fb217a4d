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

The profiling peak is measured by vLLM at start-up; kvtuner estimates it
(:func:`estimate_activation_bytes`) and says so. ``benchmarks/vllm_logs/`` checks both halves
against public logs: the pool and block arithmetic (from the logged budget) and the full
prediction (from the card's memory and our estimates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..units import GiB

#: vLLM's default KV block size in tokens (``vllm/config.py`` ``CacheConfig.block_size``
#: default 16 on CUDA, every version from v0.2 to v0.11).
VLLM_BLOCK_SIZE = 16
#: ``--gpu-memory-utilization`` default (``vllm/engine/arg_utils.py`` ``EngineArgs``).
VLLM_GPU_MEMORY_UTILIZATION = 0.9
#: ``--max-num-seqs`` default (``EngineArgs.max_num_seqs`` 256).
VLLM_MAX_NUM_SEQS = 256
#: Bytes per KV element for ``--kv-cache-dtype`` (``vllm/utils.py`` ``STR_DTYPE_TO_TORCH_DTYPE``;
#: fp8 variants are 1-byte torch.uint8 / float8 storage). ``auto``: the model dtype.
KV_DTYPE_BYTES: dict[str, int] = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1,
                                  "fp8_e5m2": 1, "float32": 4}
#: llama.cpp KV cache types and the vLLM ``--kv-cache-dtype`` that stores as few bytes
#: (q8_0 is 8.5 bits in llama.cpp; vLLM's nearest is fp8, 8 bits).
LLAMA_TO_VLLM_KV: dict[str, str] = {"f16": "auto", "bf16": "auto", "f32": "float32", "q8_0": "fp8", "q5_0": "fp8",
                                    "q5_1": "fp8", "q4_0": "fp8", "q4_1": "fp8", "iq4_nl": "fp8"}
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
        """Weights as vLLM holds them: ``n_params x weight_bytes_per_param`` bytes."""
        return int(self.n_params * self.weight_bytes_per_param)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str = "") -> "VllmModel":
        """Read an HF ``config.json`` (a multimodal one's ``text_config`` is used when present).

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
        return cls(name or str(c.get("_name_or_path") or cfg.get("_name_or_path") or c.get("model_type") or "model"),
                   n_layer, int(n_kv), int(head_dim), n_embd, n_ff, n_vocab, int(n_params), wbytes)

    @classmethod
    def from_profile(cls, profile: Any) -> "VllmModel":
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
            raise VllmError("MLA models (DeepSeek-style) keep a latent KV in vLLM: kvtuner plans vLLM only for MHA/GQA models")
        kv_layers = [il for il in range(profile.n_layer) if profile.has_kv(il) and profile.n_embd_k_gqa(il)]
        if not kv_layers:
            raise VllmError("this model has no attention KV cache to plan in vLLM")
        n_kv = max(profile.n_head_kv[il] for il in kv_layers)
        arch = profile.architecture
        n_ff = profile.metadata.get(f"{arch}.feed_forward_length", 0)
        if isinstance(n_ff, (list, tuple)):
            n_ff = max(n_ff) if n_ff else 0
        return cls(profile.name or profile.file_name, len(kv_layers), int(n_kv), int(profile.head_dim_k),
                   int(profile.n_embd), int(n_ff or 0), int(profile.n_vocab), int(profile.n_params), 2.0)


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per KV element of a ``--kv-cache-dtype`` value (:data:`KV_DTYPE_BYTES`).

    Raises:
        VllmError: an unknown name.
    """
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        raise VllmError(f"--kv-cache-dtype must be one of {', '.join(KV_DTYPE_BYTES)}, not '{kv_cache_dtype}'") from None


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

    def __post_init__(self) -> None:
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
    """kvtuner's estimate of vLLM's "PyTorch activation peak memory" for a profiling pass of
    ``n_tokens`` tokens: ``n_tokens x (3 x n_ff + 3 x n_embd) x 2`` bytes.

    The shape is a gated MLP forward (the ``gate_up_proj`` output of 2 x n_ff, the activated
    n_ff, and hidden states / residual of n_embd each, bf16); the constant 3 on n_embd is fitted to
    vllm-project/vllm#10517 (Llama-3.1-8B on an RTX 3090, v0.6.4: 2.07 GiB logged at 20000 tokens,
    2.99 GiB at 29000; this gives 2.06 and 2.99). It is an estimate, not vLLM's measurement:
    vision encoders (multimodal profiling) and MoE kernels' workspaces are not in it.
    """
    n_ff = model.n_ff or 4 * model.n_embd
    return n_tokens * (3 * n_ff + 3 * model.n_embd) * ACTIVATION_BYTES


@dataclass(frozen=True)
class VllmPlan:
    """vLLM's budget on one GPU, with where each figure came from.

    Attributes:
        total_bytes: the card's memory as vLLM sees it (``total_gpu_memory``).
        usable_bytes: ``total_bytes x gpu_memory_utilization``.
        weights_bytes, activation_bytes, non_torch_bytes: the profiled components.
        available_kv_bytes: ``usable - weights - activation - non_torch`` (0 when negative).
        block_bytes: one block (``block_size`` tokens, all layers).
        num_blocks: ``available_kv_bytes // block_bytes``.
        kv_tokens: ``num_blocks x block_size`` ("GPU KV cache size: N tokens").
        max_concurrency: requests of ``max_model_len`` tokens the pool holds at once.
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
    available_kv_bytes: int
    block_bytes: int
    num_blocks: int
    kv_tokens: int
    max_concurrency: float
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    batched_tokens: int = 0

    @property
    def fits(self) -> bool:
        """Whether one request of ``max_model_len`` tokens fits (vLLM refuses to start otherwise:
        "The model's max seq len is larger than the maximum number of tokens that can be stored
        in KV cache")."""
        return self.kv_tokens >= self.settings.max_model_len

    def to_dict(self) -> dict[str, Any]:
        """JSON-able figures (bytes, tokens)."""
        return {"total_bytes": self.total_bytes, "usable_bytes": self.usable_bytes, "weights_bytes": self.weights_bytes,
                "activation_bytes": self.activation_bytes, "non_torch_bytes": self.non_torch_bytes,
                "available_kv_bytes": self.available_kv_bytes, "block_bytes": self.block_bytes,
                "num_blocks": self.num_blocks, "kv_tokens": self.kv_tokens,
                "max_concurrency": round(self.max_concurrency, 4), "fits": self.fits, "sources": dict(self.sources),
                "batched_tokens": self.batched_tokens,
                "notes": list(self.notes)}


def pool_from_available(model: VllmModel, settings: VllmSettings, available_kv_bytes: int) -> tuple[int, int, int, float]:
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


def plan_vllm(model: VllmModel, settings: VllmSettings, total_bytes: int, *, weights_bytes: int | None = None,
              activation_bytes: int | None = None, non_torch_bytes: int | None = None, gpu_name: str = "") -> VllmPlan:
    """Plan vLLM's KV pool on one GPU of ``total_bytes``.

    Components given (e.g. from a log) are used as they are; the others are estimated: weights
    ``n_params x weight_bytes_per_param``, the activation peak by
    :func:`estimate_activation_bytes` at :meth:`VllmSettings.batched_tokens` (for this card,
    ``gpu_name``), non-torch memory
    :data:`DEFAULT_NON_TORCH_BYTES`.

    Raises:
        VllmError: ``total_bytes`` not positive.
    """
    if total_bytes <= 0:
        raise VllmError("the GPU's memory must be positive: give --gpu NAME or --gpu-mem SIZE")
    sources = {"weights": "logged" if weights_bytes is not None else "estimated",
               "activation": "logged" if activation_bytes is not None else "estimated",
               "non_torch": "logged" if non_torch_bytes is not None else "estimated"}
    w = model.weights_bytes if weights_bytes is None else int(weights_bytes)
    n_tokens = settings.batched_tokens(total_bytes, gpu_name)
    a = estimate_activation_bytes(model, n_tokens) if activation_bytes is None else int(activation_bytes)
    n = DEFAULT_NON_TORCH_BYTES if non_torch_bytes is None else int(non_torch_bytes)
    usable = int(total_bytes * settings.gpu_memory_utilization)
    avail = max(usable - w - a - n, 0)
    block, blocks, tokens, conc = pool_from_available(model, settings, avail)
    notes = ["CUDA graphs are captured after the KV pool is sized: their memory (typically 0.1-1 GiB) comes on top "
             "of --gpu-memory-utilization" if not settings.enforce_eager else "",
             "vLLM measures the activation peak at start-up; kvtuner's figure is an estimate"
             if sources["activation"] == "estimated" else ""]
    return VllmPlan(settings, model, int(total_bytes), usable, w, a, n, avail, block, blocks, tokens, conc, sources,
                    tuple(x for x in notes if x), n_tokens)


#: Share of a card's nominal memory that CUDA reports as ``total_gpu_memory`` (the driver keeps
#: the rest): 23.58 GiB of an RTX 3090's 24 (vllm-project/vllm#10517), 79.22 GiB of an H100's 80
#: (vllm-project/vllm#12126); kvtuner takes 0.985, between the two.
CUDA_REPORTED_FRACTION = 0.985


def cuda_reported_total(nominal_bytes: int) -> int:
    """``total_gpu_memory`` vLLM will see on a card of ``nominal_bytes``:
    ``nominal x CUDA_REPORTED_FRACTION`` bytes."""
    return int(nominal_bytes * CUDA_REPORTED_FRACTION)
