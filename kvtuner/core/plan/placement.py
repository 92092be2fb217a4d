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

from dataclasses import dataclass
from typing import Callable

from .config import ALL_LAYERS, ConfigError, PlanConfig


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
    """

    n_gpu_layers: int
    offload_kqv: bool
    weight_overrides: tuple[tuple[str, str], ...]
    offloaded_repeating_layers: int | None
    kv_gpu_layers: int | None
    experimental: bool
    override_layers: tuple[int, ...] = ()

    @property
    def mode(self) -> str:
        """``"gpu"`` (KV with its layers), ``"host"`` (``-nkvo``) or ``"split"`` (tensor overrides)."""
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


def placement_for(config: PlanConfig, n_layer: int | Callable[[], int], device: str = "CUDA0") -> LayerPlacement:
    """Layer and KV placement for ``config`` on a model with ``n_layer`` repeating layers.

    ``n_layer`` may be a callable; it is then called only when the answer depends on it (a
    partial KV split), so exports of plain configurations never read the model.

    Raises:
        ConfigError: ``kv_gpu_layers`` exceeds the offloaded repeating layers.
    """
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
