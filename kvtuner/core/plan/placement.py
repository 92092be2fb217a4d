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
memory. Memory layout checked on a GPU (weights and KV per device as planned: docs/accuracy/gpu.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    (llama-model-loader.cpp ``create_tensor``).

    Same answer as trying every pattern in order, found faster (the tuner plans hundreds of
    configurations with one ``blk\\.i...`` override per layer, ``--n-cpu-ffn``/``--n-cpu-moe``):
    a pattern is only tried when its leading literal text (:func:`_required_literal`) is in the
    name, patterns starting ``blk\\.N\\.`` are looked up by the name's block number, and the
    answer is remembered per override list and name."""
    if not overrides:
        return default
    return override_lookup(overrides)(name) or default


def override_lookup(overrides: tuple[tuple[str, str], ...]) -> Callable[[str], str]:
    """``lookup(name)``: the buffer of the first override that matches tensor ``name``, ``""`` for
    none (:func:`tensor_device` for many names: the override list is indexed once)."""
    return _OverrideIndex.of(tuple(overrides)).buffer


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_QUANTIFIERS = "*+?{"
_SPECIAL = ".^$*+?{}[]()|"
_BLK_LITERAL = re.compile(r"^blk\.(\d+)\.")


@functools.lru_cache(maxsize=4096)
def _required_literal(pattern: str) -> str:
    """Text every match of ``pattern`` contains: its leading run of literal characters (after an
    optional ``^``), without a last character that a quantifier makes optional; ``""`` when the
    pattern has an alternation outside groups (``a|b``) or starts with anything else."""
    depth, i, in_class = 0, 0, False
    while i < len(pattern):  # an alternation at depth 0 makes any prefix optional
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return ""
        i += 1
    out: list[str] = []
    i = 1 if pattern.startswith("^") else 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1].isalnum():
                break  # \d, \w, \b, back references ...: not a literal
            nxt = pattern[i + 2] if i + 2 < len(pattern) else ""
            if nxt and nxt in _QUANTIFIERS:
                break
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in _SPECIAL:
            if c in _QUANTIFIERS and out:
                out.pop()
            break
        out.append(c)
        i += 1
    return "".join(out)


class _OverrideIndex:
    """One override list, indexed for :func:`tensor_device` (see there)."""

    _BLK_ANY = re.compile(r"blk\.(\d+)\.")

    def __init__(self, overrides: tuple[tuple[str, str], ...]):
        self.entries = [(_required_literal(p), _compiled(p), b) for p, b in overrides]
        self.by_block: dict[str, list[int]] = {}
        self.other: list[int] = []
        for i, (lit, _, _) in enumerate(self.entries):
            m = _BLK_LITERAL.match(lit)
            if m:
                self.by_block.setdefault(m.group(1), []).append(i)
            else:
                self.other.append(i)
        self.memo: dict[str, str] = {}

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def of(overrides: tuple[tuple[str, str], ...]) -> _OverrideIndex:
        return _OverrideIndex(overrides)

    def buffer(self, name: str) -> str:
        """The buffer of the first matching override, ``""`` for none."""
        hit = self.memo.get(name)
        if hit is not None:
            return hit
        # a literal "blk.N.<...>" can only be in the name where the name has "blk.N."
        idx = list(self.other)
        for n in self._BLK_ANY.findall(name):
            idx += self.by_block.get(n, ())
        out = ""
        for i in sorted(set(idx)):
            lit, rx, buf = self.entries[i]
            if lit in name and rx.search(name):
                out = buf
                break
        self.memo[name] = out
        return out


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


# ------------------------------------------------------------------------------ several devices
#: llama.cpp's split modes (``-sm``, common/arg.cpp; ``llama_split_mode`` in include/llama.h).
#: ``tensor`` (the experimental meta device) is not planned: :class:`DeviceSplit` refuses it.
SPLIT_MODES = ("none", "layer", "row")
#: ``llama_max_devices()`` (src/llama.cpp: ``LLAMA_MAX_DEVICES``, 16); common/arg.cpp refuses a
#: ``-ts`` list of that many entries or more.
LLAMA_MAX_DEVICES = 16


@dataclass(frozen=True)
class DeviceSplit:
    """How the offloaded layers are spread over several devices (``-sm``, ``-ts``, ``-mg``).

    Attributes:
        split_mode: ``layer`` (default: whole layers per device, each layer's KV with it),
            ``none`` (only device ``main_gpu``) or ``row`` (planned like ``layer``; see
            :func:`device_layer_split`).
        tensor_split: proportions per device (``-ts 3,1``), in llama.cpp's device order (RPC
            servers first, then local GPUs); None: by each device's free memory.
        main_gpu: ``-mg``, an index into that device order (the single device with ``none``).

    Raises:
        ConfigError: a negative or non-finite share, an all-zero or too long ``-ts``, an unknown
            mode, or a negative ``-mg`` (one line each, saying what to change).
    """

    split_mode: str = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int = 0

    def __post_init__(self) -> None:
        if self.split_mode == "tensor":
            raise ConfigError(
                "--split-mode tensor (llama.cpp's experimental meta device) is not planned: use layer, row or none"
            )
        if self.split_mode not in SPLIT_MODES:
            raise ConfigError(f"--split-mode must be none, layer or row, not '{self.split_mode}'")
        if self.tensor_split is not None:
            ts = tuple(float(x) for x in self.tensor_split)
            object.__setattr__(self, "tensor_split", ts)
            if any(not (x >= 0.0) or x == float("inf") for x in ts):
                raise ConfigError(
                    f"--tensor-split shares must be finite and 0 or more, not {','.join(f'{x:g}' for x in ts)}"
                )
            if len(ts) >= LLAMA_MAX_DEVICES:
                raise ConfigError(
                    f"--tensor-split has {len(ts)} entries; llama.cpp takes fewer than {LLAMA_MAX_DEVICES}"
                )
            if not any(ts):
                raise ConfigError(
                    "--tensor-split is all zeros: give a positive share to at least one device, or leave it out"
                )
        if self.main_gpu < 0:
            raise ConfigError(f"--main-gpu must be a device index, 0 or more, not {self.main_gpu}")

    def flags(self) -> list[str]:
        """llama.cpp's flags for this split (``-sm row -ts 3,1 -mg 1``); the defaults write nothing."""
        out: list[str] = []
        if self.split_mode != "layer":
            out += ["-sm", self.split_mode]
        if self.tensor_split is not None:
            out += ["-ts", ",".join(f"{x:g}" for x in self.tensor_split)]
        if self.main_gpu != 0:
            out += ["-mg", str(self.main_gpu)]
        return out


def _f32(x: float) -> float:
    """``x`` rounded to an IEEE float32, as llama.cpp holds the split points (``std::vector<float>``)."""
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def split_devices(n_devices: int, split: DeviceSplit) -> list[int]:
    """Indices of the devices llama.cpp keeps, in its order (src/llama.cpp
    ``llama_prepare_model_devices``): all of them, or with ``-sm none`` only ``main_gpu``.

    Raises:
        ConfigError: ``-sm none`` with ``-mg`` past the last device (llama.cpp: "invalid value for
            main_gpu"), or a ``-ts`` whose length is not the device count (llama.cpp silently
            ignores extra shares and gives missing ones 0; kvtuner asks for one share per device).
    """
    if split.tensor_split is not None and n_devices and len(split.tensor_split) != n_devices:
        raise ConfigError(
            f"--tensor-split has {len(split.tensor_split)} shares for {n_devices} devices "
            "(RPC servers first, then local GPUs): give one share per device"
        )
    if split.split_mode == "none" and n_devices:
        if split.main_gpu >= n_devices:
            raise ConfigError(
                f"--main-gpu {split.main_gpu} is past the last of the {n_devices} devices: use 0 to {n_devices - 1}"
            )
        return [split.main_gpu]
    return list(range(n_devices))


def device_layer_split(n_layer: int, n_gpu_layers: int, shares: Sequence[float]) -> list[int | None]:
    """Device index of layers ``0..n_layer`` (the last entry is the output layer), None for the CPU.

    src/llama-model.cpp ``load_tensors``: the split points are the cumulative ``shares`` (``-ts``,
    or each device's free memory when ``-ts`` is absent or all zero) normalised by their sum, held
    as ``float``; with ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)`` and
    ``act_gpu_layers = min(n_gpu_layers, n_layer + 1)`` layer ``il >= i_gpu_start`` goes to
    ``upper_bound(splits, float(il - i_gpu_start) / act_gpu_layers)``. The output layer is
    ``il = n_layer`` and so lands on the LAST device holding layers; the input embedding stays on
    the CPU. ``-sm row`` assigns layers (norms, KV, the output layer) by the same rule; llama.cpp
    then splits each layer's matrices by rows over all CUDA devices (``make_gpu_buft_list``, CUDA's
    split buffer type) - kvtuner plans row mode as layer mode and says so.

    Args:
        n_layer: repeating layers.
        n_gpu_layers: offloaded layers, output layer included (-1: all).
        shares: one non-negative weight per device kept (:func:`split_devices`).
    """
    if not shares:
        return [None] * (n_layer + 1)
    ngl = n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
    splits: list[float] = []
    acc = 0.0
    for s in shares:
        acc = _f32(acc + _f32(s))
        splits.append(acc)
    splits = [_f32(s / acc) for s in splits]
    i_gpu_start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    out: list[int | None] = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or (il - i_gpu_start) >= act:
            out.append(None)
        else:
            k = bisect.bisect_right(splits, _f32(_f32(il - i_gpu_start) / act))
            out.append(min(k, len(shares) - 1))  # .at() would throw past the end; float sums end at 1.0
    return out
