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
memory. EXPERIMENTAL: not yet checked on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ALL_LAYERS, ConfigError, PlanConfig


@dataclass(frozen=True)
class LayerPlacement:
    """What to pass to llama.cpp.

    Attributes:
        n_gpu_layers: ``llama_model_params.n_gpu_layers`` (-1 = all).
        offload_kqv: ``llama_context_params.offload_kqv``.
        weight_overrides: ``(regex, device)`` pairs for ``tensor_buft_overrides``.
        offloaded_repeating_layers: repeating layers whose weights the plan puts on the GPU.
        kv_gpu_layers: repeating layers whose KV ends up in VRAM.
        experimental: True when the placement relies on the tensor-override split.
    """

    n_gpu_layers: int
    offload_kqv: bool
    weight_overrides: tuple[tuple[str, str], ...]
    offloaded_repeating_layers: int
    kv_gpu_layers: int
    experimental: bool


def offloaded_repeating_layers(n_gpu_layers: int, n_layer: int) -> int:
    """Repeating layers on the GPU for ``-ngl n_gpu_layers`` (output layer first), per
    llama-model.cpp ``load_tensors``: ``min(ngl, n_layer + 1) - 1`` (0 when ngl is 0)."""
    ngl = n_layer + 1 if n_gpu_layers == ALL_LAYERS or n_gpu_layers < 0 else n_gpu_layers
    return max(min(ngl, n_layer + 1) - 1, 0)


def layer_regex(layers: list[int] | range) -> str:
    """Regex matching the tensors of the given repeating layers (``^blk\\.(3|4|5)\\.``)."""
    layers = sorted(set(layers))
    if not layers:
        raise ValueError("no layers")
    return r"^blk\.(" + "|".join(str(i) for i in layers) + r")\."


def placement_for(config: PlanConfig, n_layer: int, device: str = "CUDA0") -> LayerPlacement:
    """Layer and KV placement for ``config`` on a model with ``n_layer`` repeating layers.

    Raises:
        ConfigError: ``kv_gpu_layers`` exceeds the offloaded repeating layers.
    """
    if n_layer <= 0:
        raise ValueError(f"n_layer must be positive, got {n_layer}")
    n_off = offloaded_repeating_layers(config.n_gpu_layers, n_layer)
    kv = config.kv_gpu_layers
    if kv is None or kv == n_off:
        return LayerPlacement(config.n_gpu_layers, True, (), n_off, n_off, False)
    if kv > n_off:
        raise ConfigError(
            f"--kv-gpu-layers {kv} is more than the {n_off} repeating layers offloaded by --ngl "
            f"{'all' if config.n_gpu_layers == ALL_LAYERS else config.n_gpu_layers}: lower it to {n_off} or raise --ngl"
        )
    if kv == 0:
        return LayerPlacement(config.n_gpu_layers, False, (), n_off, 0, False)
    # 0 < kv < n_off: llama.cpp offloads the output layer and the last kv repeating layers;
    # the planned layers before them get their weights moved by override, KV stays on the host.
    moved = range(n_layer - n_off, n_layer - kv)
    return LayerPlacement(
        n_gpu_layers=kv + 1,
        offload_kqv=True,
        weight_overrides=((layer_regex(moved), device),),
        offloaded_repeating_layers=n_off,
        kv_gpu_layers=kv,
        experimental=True,
    )
