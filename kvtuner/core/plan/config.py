"""The configuration a user tunes: llama.cpp context and model parameters.

Names follow llama.cpp (``llama_model_params`` / ``llama_context_params`` and the
``llama-server`` flags shown in brackets). A :class:`PlanConfig` is immutable; use
:func:`dataclasses.replace` to derive another.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from ..model.ggml_types import kv_type
from .llama_constants import CTX_PAD_CELLS, LLAMA_MAX_SEQ

FlashAttn = Literal["on", "off", "auto"]

#: ``n_gpu_layers`` value meaning "every repeating layer and the output layer" (``-ngl all``).
ALL_LAYERS = -1
#: Largest ``n_ctx`` llama.cpp can hold: ``llama_context_params.n_ctx`` is a ``uint32_t`` and
#: llama-context.cpp pads it up to a multiple of :data:`CTX_PAD_CELLS`, so 2**32 - 256
#: (n_batch/n_ubatch: 2**32 - 1).
MAX_N_CTX = (1 << 32) - CTX_PAD_CELLS
MAX_UINT32 = (1 << 32) - 1
#: ``llama_model_params.n_gpu_layers`` is an ``int32_t``.
MAX_INT32 = (1 << 31) - 1


class ConfigError(ValueError):
    """A configuration that llama.cpp would refuse or that cannot be planned.

    The message is one line that says what to change.
    """


@dataclass(frozen=True)
class PlanConfig:
    """One llama.cpp configuration.

    Attributes:
        n_ctx: context size in tokens for all sequences together (``-c``); llama.cpp pads
            it up to a multiple of 256 (llama-context.cpp).
        n_gpu_layers: layers offloaded to the GPU (``-ngl``), 0 .. n_layer + 1, or
            :data:`ALL_LAYERS`. The output layer counts as one of them (llama-model.cpp
            ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``).
        kv_gpu_layers: how many of the offloaded repeating layers keep their KV cache in
            VRAM. ``None`` means all of them (llama.cpp's default, ``offload_kqv``);
            0 means ``-nkvo``. Between, the split is done with tensor overrides.
        type_k, type_v: KV cache types (``-ctk`` / ``-ctv``), see :data:`KV_CACHE_TYPES`.
        flash_attn: ``on``, ``off`` or ``auto`` (``-fa``).
        n_seq: parallel sequences (``-np``, ``n_seq_max``), each with its own KV stream.
        n_ubatch: physical batch size (``-ub``), sizes the compute buffer.
        n_batch: logical batch size (``-b``).
        swa_full: full-size cache for sliding-window layers (``--swa-full``).
        kv_unified: one KV buffer shared by all sequences (``--kv-unified``).
        use_mmap: memory-map the weights (``--no-mmap`` turns it off).
        n_cpu_moe: keep the MoE expert tensors of the first N layers in host memory
            (``--n-cpu-moe N``): llama.cpp adds one override ``blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU``
            per layer ``i < N`` (common/common.h ``llm_add_n_cpu_ffn_overrides``, ``LLM_FFN_EXPS_REGEX``).
        cpu_moe: keep every layer's expert tensors in host memory (``--cpu-moe``: one override
            ``\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU``, common/common.h ``llm_ffn_exps_cpu_override``).
        n_cpu_ffn: keep the dense FFN tensors of the first N layers in host memory
            (``--n-cpu-ffn N``): one override ``blk\\.i\\.ffn_(up|down|gate)\\.=CPU`` per layer
            ``i < N`` (common/common.h ``LLM_FFN_DENSE_REGEX``): attention and KV stay in VRAM.
        tensor_overrides: ``PATTERN=BUFFER`` tensor buffer-type overrides (``-ot``, in the order
            given; llama.cpp takes the first pattern that ``std::regex_search`` finds in a tensor's
            name, llama-model-loader.cpp). BUFFER is ``CPU`` or ``CUDA0``, ``CUDA1`` ...
    """

    n_ctx: int = 4096
    n_gpu_layers: int = ALL_LAYERS
    kv_gpu_layers: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: FlashAttn = "auto"
    n_seq: int = 1
    n_ubatch: int = 512
    n_batch: int = 2048
    swa_full: bool = False
    kv_unified: bool = False
    use_mmap: bool = True
    n_cpu_moe: int = 0
    cpu_moe: bool = False
    n_cpu_ffn: int = 0
    tensor_overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Normalise type names and reject nonsense early: every error says what to change.
        for name in ("type_k", "type_v"):
            try:
                object.__setattr__(self, name, kv_type(getattr(self, name)).name)
            except ValueError as exc:
                raise ConfigError(f"--cache-{name.replace('type_', 'type-')}: {exc}") from None
        if self.flash_attn not in ("on", "off", "auto"):
            raise ConfigError(f"--flash-attn must be on, off or auto, not '{self.flash_attn}'")
        if self.n_ctx <= 0:
            raise ConfigError(
                f"--ctx must be a positive number of tokens (or 0 for the model's training context), not {self.n_ctx}"
            )
        if self.n_ctx > MAX_N_CTX:
            raise ConfigError(
                f"--ctx must be at most {MAX_N_CTX} tokens (llama.cpp's n_ctx is 32-bit), not {self.n_ctx}"
            )
        if self.n_gpu_layers < ALL_LAYERS:
            raise ConfigError(f"--ngl must be 0 or more (or 'all'), not {self.n_gpu_layers}")
        if self.n_gpu_layers > MAX_INT32:
            raise ConfigError(f"--ngl must be at most {MAX_INT32} (or 'all'), not {self.n_gpu_layers}")
        if self.kv_gpu_layers is not None and self.kv_gpu_layers > MAX_INT32:
            raise ConfigError(f"--kv-gpu-layers must be at most {MAX_INT32}, not {self.kv_gpu_layers}")
        if self.kv_gpu_layers is not None and self.kv_gpu_layers < 0:
            raise ConfigError(f"--kv-gpu-layers must be 0 or more, not {self.kv_gpu_layers}")
        if not 1 <= self.n_seq <= LLAMA_MAX_SEQ:
            raise ConfigError(
                f"--parallel must be between 1 and {LLAMA_MAX_SEQ} (LLAMA_MAX_SEQ), or -1 for llama-server's auto, "
                f"not {self.n_seq}"
            )
        if not 0 < self.n_ubatch <= MAX_UINT32:
            raise ConfigError(f"--ubatch must be a positive number of tokens up to {MAX_UINT32}, not {self.n_ubatch}")
        if not 0 < self.n_batch <= MAX_UINT32:
            raise ConfigError(f"--batch must be a positive number of tokens up to {MAX_UINT32}, not {self.n_batch}")
        if not 0 <= self.n_cpu_moe <= MAX_INT32:
            raise ConfigError(f"--n-cpu-moe must be a number of layers from 0 up, not {self.n_cpu_moe}")
        if not 0 <= self.n_cpu_ffn <= MAX_INT32:
            raise ConfigError(f"--n-cpu-ffn must be a number of layers from 0 up, not {self.n_cpu_ffn}")
        object.__setattr__(self, "tensor_overrides", tuple(self.tensor_overrides))
        for text in self.tensor_overrides:
            parse_override(text)
        if self.type_v != "f16" and self.type_v != "f32" and self.type_v != "bf16" and self.flash_attn == "off":
            raise ConfigError(
                f"a quantized V cache ({self.type_v}) requires flash attention: "
                "use --flash-attn on (or auto), or --cache-type-v f16"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict with the field names above (``tensor_overrides`` as a list)."""
        d = asdict(self)
        d["tensor_overrides"] = list(self.tensor_overrides)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanConfig:
        """Build from :meth:`to_dict` output; unknown keys raise :class:`ConfigError`."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
        return cls(**data)

    def with_(self, **changes: Any) -> PlanConfig:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)


#: Buffer type names kvtuner plans for in ``-ot PATTERN=BUFFER``: the names llama.cpp's backends
#: give their device buffer types (ggml-cpu.cpp ``ggml_backend_cpu_buffer_type`` "CPU"; the device
#: name and index: ggml-cuda.cu ``GGML_CUDA_NAME`` "CUDA0", "ROCm0" in a HIP build, ggml-vulkan
#: "Vulkan0", ggml-sycl "SYCL0", ggml-metal "MTL0"); common/arg.cpp ``parse_tensor_buffer_overrides``
#: refuses any other name with "unknown buffer type". Which GPU a name is, and whether the planned
#: card's backend gives that name, is :func:`kvtuner.core.plan.overrides.apply_overrides`'s check.
OVERRIDE_BUFFER_RE = re.compile(r"^(CPU|(?:CUDA|ROCm|Vulkan|SYCL|MTL)\d+)$")


def parse_override(text: str) -> tuple[str, str]:
    """Split one ``-ot`` override ``PATTERN=BUFFER`` at its first ``=``, as common/arg.cpp
    ``parse_tensor_buffer_overrides`` does, and check both halves.

    The pattern is compiled with Python's ``re``; llama.cpp compiles it with ``std::regex``
    (ECMAScript grammar): the two agree on the patterns used for tensor names (``.``, ``\\.``,
    groups, alternation, classes, anchors, ``\\d``), not on Python-only syntax such as ``(?P<n>)``.

    Returns:
        ``(pattern, buffer)``.

    Raises:
        ConfigError: no ``=``, an empty or invalid pattern, or a buffer that is not ``CPU`` or a GPU
            buffer name (``CUDA<n>``, ``ROCm<n>``, ``Vulkan<n>``, ``SYCL<n>``, ``MTL<n>``).
    """
    pattern, eq, buffer = text.partition("=")
    if not eq or not pattern:
        raise ConfigError(f'--override-tensor {text!r}: write PATTERN=BUFFER, e.g. -ot "blk\\.(0|1)\\.ffn_.*_exps=CPU"')
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"--override-tensor {text!r}: invalid regular expression ({exc}): fix the pattern") from None
    if not OVERRIDE_BUFFER_RE.match(buffer):
        raise ConfigError(
            f"--override-tensor {text!r}: unknown buffer type {buffer!r}: use CPU or a GPU's name (CUDA0, ROCm0, Vulkan0 ...)"
        )
    return pattern, buffer


#: llama-server's ``-np -1`` (its default): 4 slots sharing one unified KV buffer
#: (tools/server/server.cpp ``main``: "n_parallel is set to auto, using n_parallel = 4 and kv_unified = true").
SERVER_AUTO_PARALLEL = 4


def resolve_server_defaults(values: dict[str, Any], n_ctx_train: int) -> tuple[dict[str, Any], list[str]]:
    """Resolve llama-server's special values before a :class:`PlanConfig` is built.

    - ``n_ctx == 0``: the model's training context (llama-context.cpp constructor
      ``cparams.n_ctx = params.n_ctx == 0 ? hparams.n_ctx_train : params.n_ctx``); refused like
      ``llama_init_from_model`` when the model has none ("n_ctx and model->hparams.n_ctx_train
      cannot both be zero").
    - ``n_seq == -1`` (``-np -1``, auto): :data:`SERVER_AUTO_PARALLEL` slots with a unified KV
      cache (tools/server/server.cpp).

    Args:
        values: configuration field values (``PlanConfig`` names); others pass through.
        n_ctx_train: the model's trained context in tokens (0: unknown).

    Returns:
        ``(values, notes)``: the resolved values and one line per resolution, e.g.
        ``"ctx 0 -> 131072 (training context)"``.

    Raises:
        ConfigError: ``--ctx 0`` on a model without a training context, or ``-np`` below -1.
    """
    out = dict(values)
    notes: list[str] = []
    if out.get("n_seq") == -1:
        out["n_seq"] = SERVER_AUTO_PARALLEL
        out["kv_unified"] = True
        notes.append(f"-np -1 -> {SERVER_AUTO_PARALLEL} sequences, unified KV cache (llama-server's auto)")
    elif isinstance(out.get("n_seq"), int) and out["n_seq"] < -1:
        raise ConfigError(
            f"--parallel must be between 1 and {LLAMA_MAX_SEQ}, or -1 for llama-server's auto, not {out['n_seq']}"
        )
    if out.get("n_ctx") == 0:
        if not n_ctx_train:
            raise ConfigError("--ctx 0 means the model's training context, and this model states none: give --ctx N")
        out["n_ctx"] = n_ctx_train
        notes.append(f"ctx 0 -> {n_ctx_train} (training context)")
    return out, notes
