"""Map a :class:`PlanConfig` onto llama.cpp's layer/KV placement parameters.

Pure Python (core: no ``llama_cpp``): the runner's worker applies the result, the exporters write it
as flags, tests check it without a GPU.

llama.cpp rules (llama-model.cpp ``load_tensors``): ``i_gpu_start = max(n_layer + 1 - ngl, 0)``;
the last repeating layers go to the GPU and the output layer counts as one of the ``ngl``
layers (offloaded first); a negative ``ngl`` means all ``n_layer + 1``. Each offloaded layer
keeps its KV cache on its device when ``offload_kqv`` (llama-kv-cache.cpp constructor,
``model.dev_layer(il)``), all KV stays on the host with ``offload_kqv=False`` (``-nkvo``).

There is no per-layer KV flag upstream (ggml-org/llama.cpp#12663). For
``0 < kv_gpu_layers < offloaded repeating layers`` kvtuner offloads only
``kv_gpu_layers`` repeating layers (+ the output layer) the normal way, so their KV is in
VRAM, and moves the weights of the other planned layers to the GPU with tensor buffer-type
overrides (``-ot "^blk\\.(i|j)\\.=CUDA0"``, llama-model-loader.cpp ``regex_search`` on the
tensor name); llama.cpp still treats those layers as host layers, so their KV stays in host
memory. Checked on a GPU: memory layout checked on an H200 (llama-cpp-python 0.3.36, 2026-11-30: weights and KV per device as planned).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Callable

from .config import ALL_LAYERS, ConfigError, PlanConfig, parse_override


@dataclass(frozen=True)
class LayerPlacement:
    """What to pass to llama.cpp for a layer/KV layout.

    Attributes:
        n_gpu_layers: ``llama_model_params.n_gpu_layers`` (-1 = all).
        offload_kqv: ``llama_context_params.offload_kqv`` (False is ``-nkvo``).
        weight_overrides: ``(regex, device)`` pairs for ``tensor_buft_overrides`` (``-ot``).
        offloaded_repeating_layers: repeating layers whose weights the plan puts on the GPU
            (None when ``n_layer`` was given lazily and this answer did not need it).
        kv_gpu_layers: repeating layers whose KV ends up in VRAM (None: as above).
        experimental: True when the placement relies on the tensor-override split.
        override_layers: the repeating layers ``weight_overrides`` moves to the GPU, ascending.
        tensor_overrides: the overrides of ``-ot``, ``--cpu-moe`` and ``--n-cpu-moe`` as
            ``(regex, buffer)``, in llama.cpp's order (:func:`tensor_overrides`); they lead
            ``weight_overrides`` too, since llama.cpp takes the first pattern that matches.
    """

    n_gpu_layers: int
    offload_kqv: bool
    weight_overrides: tuple[tuple[str, str], ...]
    offloaded_repeating_layers: int | None
    kv_gpu_layers: int | None
    experimental: bool
    override_layers: tuple[int, ...] = ()
    tensor_overrides: tuple[tuple[str, str], ...] = ()

    @property
    def mode(self) -> str:
        """``"gpu"`` (KV with its layers), ``"host"`` (``-nkvo``) or ``"split"`` (the KV split's tensor overrides)."""
        if not self.offload_kqv:
            return "host"
        return "split" if self.override_layers else "gpu"


def offloaded_repeating_layers(n_gpu_layers: int, n_layer: int) -> int:
    """Repeating layers on the GPU for ``-ngl n_gpu_layers`` (output layer first), per
    llama-model.cpp ``load_tensors``: ``min(ngl, n_layer + 1) - 1`` (0 when ngl is 0)."""
    ngl = n_layer + 1 if n_gpu_layers == ALL_LAYERS or n_gpu_layers < 0 else n_gpu_layers
    return max(min(ngl, n_layer + 1) - 1, 0)


def layer_regex(layers: list[int] | range | tuple[int, ...]) -> str:
    """Regex matching the tensors of the given repeating layers (``^blk\\.(3|4|5)\\.``).

    llama.cpp matches ``-ot`` patterns with ``std::regex_search`` against tensor names such as
    ``blk.12.attn_q.weight`` (common/arg.cpp ``parse_tensor_buffer_overrides``,
    llama-model-loader.cpp); ``blk\\.(3|4)\\.`` cannot match ``blk.13.`` because the layer number
    must follow ``blk.`` directly.
    """
    layers = sorted(set(layers))
    if not layers:
        raise ValueError("no layers")
    return r"^blk\.(" + "|".join(str(i) for i in layers) + r")\."


#: llama.cpp's MoE expert tensor pattern (common/common.h ``LLM_FFN_EXPS_REGEX``): the up, down,
#: gate and fused gate_up expert tensors (``_exps``) and the chunked ones (``_chexps``), weights
#: and biases alike (``regex_search`` finds it inside ``blk.3.ffn_up_exps.bias``).
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: llama.cpp's dense FFN pattern (common/common.h ``LLM_FFN_DENSE_REGEX``, ``--n-cpu-ffn``).
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."


def ffn_block_regex(il: int, ffn_regex: str = FFN_EXPS_REGEX) -> str:
    """One layer's FFN pattern, common/common.h ``llm_ffn_block_regex``: ``blk\\.{il}`` + the
    FFN regex (``blk\\.3\\.ffn_...`` cannot match ``blk.13.``: ``blk.`` must precede the 3)."""
    return rf"blk\.{il}{ffn_regex}"


def tensor_overrides(config: PlanConfig) -> tuple[tuple[str, str], ...]:
    """The ``(regex, buffer)`` tensor overrides a configuration gives llama.cpp, in the order
    common/arg.cpp appends them for ``-ot ... --cpu-moe --n-cpu-moe N --n-cpu-ffn M`` (kvtuner's
    exports write the flags in that order): the ``-ot`` overrides as given, then ``--cpu-moe``'s
    ``FFN_EXPS_REGEX=CPU`` (``llm_ffn_exps_cpu_override``), then one ``blk\\.i`` + ``FFN_EXPS_REGEX
    =CPU`` per layer ``i < n_cpu_moe`` (``llm_add_n_cpu_ffn_overrides``), then ``blk\\.i`` +
    ``FFN_DENSE_REGEX=CPU`` per layer ``i < n_cpu_ffn``. llama.cpp takes the
    first match (llama-model-loader.cpp ``create_tensor``: ``break`` after ``regex_search``).

    Raises:
        ConfigError: an ``-ot`` override that is not ``PATTERN=BUFFER`` (:func:`parse_override`).
    """
    out = [parse_override(t) for t in config.tensor_overrides]
    if config.cpu_moe:
        out.append((FFN_EXPS_REGEX, "CPU"))
    out += [(ffn_block_regex(i), "CPU") for i in range(config.n_cpu_moe)]
    out += [(ffn_block_regex(i, FFN_DENSE_REGEX), "CPU") for i in range(config.n_cpu_ffn)]
    return tuple(out)


def tensor_device(name: str, default: str, overrides: tuple[tuple[str, str], ...]) -> str:
    """The device llama.cpp puts tensor ``name`` on: the buffer of the first override whose
    pattern ``regex_search`` finds in the name (``re.search``), else ``default``
    (llama-model-loader.cpp ``create_tensor``)."""
    for pattern, buffer in overrides:
        if _compiled(pattern).search(name):
            return buffer
    return default


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> "re.Pattern[str]":
    return re.compile(pattern)


def placement_for(config: PlanConfig, n_layer: int | Callable[[], int], device: str = "CUDA0") -> LayerPlacement:
    """Layer and KV placement for ``config`` on a model with ``n_layer`` repeating layers, with
    the configuration's tensor overrides (:func:`tensor_overrides`) ahead of the KV split's.

    ``n_layer`` may be a callable; it is then called only when the answer depends on it (a
    partial KV split), so exports of plain configurations never read the model.

    Raises:
        ConfigError: ``kv_gpu_layers`` exceeds the offloaded repeating layers.
    """
    p = _layer_placement(config, n_layer, device)
    ot = tensor_overrides(config)
    if not ot:
        return p
    return dataclasses.replace(p, weight_overrides=ot + p.weight_overrides, tensor_overrides=ot)


def _layer_placement(config: PlanConfig, n_layer: int | Callable[[], int], device: str) -> LayerPlacement:
    kv = config.kv_gpu_layers
    lazy = callable(n_layer)
    if lazy and kv in (None, 0):
        return LayerPlacement(config.n_gpu_layers, kv is None, (), None, None if kv is None else 0, False)
    n = int(n_layer() if callable(n_layer) else n_layer)
    if n <= 0:
        raise ValueError(f"n_layer must be positive, got {n}")
    n_off = offloaded_repeating_layers(config.n_gpu_layers, n)
    if kv is None or kv == n_off:
        return LayerPlacement(config.n_gpu_layers, True, (), n_off, n_off, False)
    if kv > n_off:
        raise ConfigError(
            f"--kv-gpu-layers {kv} exceeds the {n_off} repeating layers offloaded by --ngl "
            f"{'all' if config.n_gpu_layers == ALL_LAYERS else config.n_gpu_layers}: "
            f"lower --kv-gpu-layers to {n_off} or less, or raise --ngl"
        )
    if kv == 0:
        return LayerPlacement(config.n_gpu_layers, False, (), n_off, 0, False)
    # 0 < kv < n_off: llama.cpp offloads the output layer and the last kv repeating layers;
    # the planned layers before them get their weights moved by override, KV stays on the host.
    moved = tuple(range(n - n_off, n - kv))
    return LayerPlacement(
        n_gpu_layers=kv + 1,
        offload_kqv=True,
        weight_overrides=((layer_regex(moved), device),),
        offloaded_repeating_layers=n_off,
        kv_gpu_layers=kv,
        experimental=True,
        override_layers=moved,
    )
