"""koboldcpp: a ``.kcpps`` settings file (``koboldcpp --config FILE.kcpps``).

A .kcpps file is the JSON of koboldcpp's parsed command line: its keys are the argparse
destinations (koboldcpp.py, v1.102): ``model_param`` (the model path), ``contextsize``
(256..262144), ``gpulayers`` (-1 = auto-guess), ``flashattention``, ``quantkv`` (0 = f16,
1 = q8_0, 2 = q4_0, for K and V together; "requires Flash Attention for full effect,
otherwise only K cache is quantized"), ``lowvram`` (= ``-nkvo``), ``usemmap`` (off by default),
``useswa`` (the small sliding-window cache; default off = full size), ``batchsize`` (one of
16..4096; older versions call it ``blasbatchsize``: both keys are written) and
``overridetensors`` (llama.cpp's ``-ot``, comma-separated) and ``moecpu`` (``--moecpu N``: the MoE experts
of the first N layers in RAM, llama.cpp's ``--n-cpu-moe``). Keys not written keep koboldcpp's defaults.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from ..model.ggml_types import kv_type
from ..plan.config import ALL_LAYERS, PlanConfig
from ..plan.fields import FIELDS
from ..plan.placement import tensor_overrides
from ._common import ExportError, ExportResult, check_path_text, kv_placement, override_pattern, safe_stem

#: quantkv level -> KV type (koboldcpp --help).
QUANTKV_LEVELS = {0: "f16", 1: "q8_0", 2: "q4_0"}
#: --batchsize choices in koboldcpp.py.
BATCH_CHOICES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: gpulayers meaning "every layer" (koboldcpp's -1 means auto-guess, not all).
ALL_LAYERS_GPULAYERS = 999
CONTEXT_MIN, CONTEXT_MAX = 256, 262144


def _bytes_per_element(name: str) -> float:
    return kv_type(name).bytes_per_element


def nearest_shared_kv_type(type_k: str, type_v: str, allowed: Sequence[str]) -> str:
    """One type for K and V, from ``allowed``, for a target that cannot set them apart.

    The exact type when K == V and it is allowed; otherwise the largest allowed type that
    uses no more memory than the requested pair (so the export never needs more memory than
    was planned), or the smallest allowed type if none fits.
    """
    if type_k == type_v and type_k in allowed:
        return type_k
    budget = _bytes_per_element(type_k) + _bytes_per_element(type_v)
    fitting = [t for t in allowed if 2 * _bytes_per_element(t) <= budget + 1e-9]
    if fitting:
        return max(fitting, key=_bytes_per_element)
    return min(allowed, key=_bytes_per_element)


def _quantkv(config: PlanConfig, fa: bool) -> tuple[int, str, str]:
    """(level, effective K type, effective V type) closest to the config without using more memory."""
    want = (config.type_k, config.type_v)
    budget = _bytes_per_element(config.type_k) + _bytes_per_element(config.type_v)
    options = []
    for level, t in QUANTKV_LEVELS.items():
        eff = (t, t) if fa else (t, "f16")  # without FA only K is quantized
        options.append((level, eff, _bytes_per_element(eff[0]) + _bytes_per_element(eff[1])))
    for level, eff, _ in options:
        if eff == want:
            return level, *eff
    fitting = [o for o in options if o[2] <= budget + 1e-9]
    level, eff, _ = max(fitting, key=lambda o: o[2]) if fitting else min(options, key=lambda o: o[2])
    return level, *eff


def render(
    model_path: Path, config: PlanConfig, n_layer: Callable[[], int], *, gpu_buffer_type: str = "CUDA0"
) -> ExportResult:
    """The .kcpps JSON for ``config``.

    Raises:
        ExportError: a context koboldcpp refuses, an unusable path, an impossible ``kv_gpu_layers``.
    """
    path_text = check_path_text(model_path)
    placement = kv_placement(config, n_layer)
    notes: list[str] = []
    if config.n_ctx > CONTEXT_MAX:
        raise ExportError(f"koboldcpp accepts --contextsize up to {CONTEXT_MAX}: lower --ctx from {config.n_ctx}")
    contextsize = max(config.n_ctx, CONTEXT_MIN)
    if contextsize != config.n_ctx:
        notes.append(
            f"koboldcpp's smallest context is {CONTEXT_MIN} tokens: contextsize {CONTEXT_MIN} instead of {config.n_ctx}."
        )

    fa = config.flash_attn != "off"
    if config.flash_attn == "auto":
        notes.append("koboldcpp's flashattention is on or off: 'auto' is written as on.")
    level, eff_k, eff_v = _quantkv(config, fa)
    if (eff_k, eff_v) != (config.type_k, config.type_v):
        notes.append(
            f"koboldcpp's quantkv offers only f16, q8_0 and q4_0 for K and V together (K only without flash "
            f"attention): K {config.type_k} / V {config.type_v} becomes K {eff_k} / V {eff_v} (quantkv {level})."
        )

    key = {f.name: f.koboldcpp for f in FIELDS}  # .kcpps keys from the catalogue
    settings: dict[str, object] = {"model_param": path_text, key["n_ctx"]: contextsize}
    if placement.mode == "split":
        settings[key["n_gpu_layers"]] = placement.n_gpu_layers
    else:
        settings[key["n_gpu_layers"]] = (
            ALL_LAYERS_GPULAYERS if config.n_gpu_layers == ALL_LAYERS else config.n_gpu_layers
        )
    settings.update(
        {
            key["flash_attn"]: fa,
            key["type_k"]: level,
            key["kv_gpu_layers"]: placement.mode == "host",
            key["use_mmap"]: config.use_mmap,
            "useswa": not config.swa_full,
        }
    )
    ubatch = min(config.n_batch, config.n_ubatch)  # llama.cpp clamps -ub to -b
    batch = max([b for b in BATCH_CHOICES if b <= ubatch] or [BATCH_CHOICES[0]])
    if batch != ubatch:
        notes.append(
            f"koboldcpp's batchsize is a power of two from {BATCH_CHOICES[0]} to {BATCH_CHOICES[-1]}: "
            f"{batch} for n_ubatch {ubatch}."
        )
    settings[key["n_ubatch"]] = batch
    settings["blasbatchsize"] = batch
    # MoE experts in RAM: koboldcpp's --moecpu N (its .kcpps key "moecpu": the experts of the first
    # N layers, llama.cpp's --n-cpu-moe); --cpu-moe is every layer; -ot goes to overridetensors,
    # comma-separated like llama.cpp's -ot list (common/arg.cpp parse_tensor_buffer_overrides)
    if config.n_cpu_moe or config.cpu_moe:
        settings[key["n_cpu_moe"]] = n_layer() if config.cpu_moe else config.n_cpu_moe
    overrides = list(config.tensor_overrides)
    if config.n_cpu_ffn:  # koboldcpp has no --n-cpu-ffn: llama.cpp's overrides, spelled out
        overrides += [f"{p}={b}" for p, b in tensor_overrides(config)[-config.n_cpu_ffn :]]
    experimental = False
    if placement.mode == "split":
        overrides.append(override_pattern(placement.override_layers, gpu_buffer_type))
    if overrides:
        settings["overridetensors"] = ",".join(overrides)
    if placement.mode == "split":
        experimental = True
        notes.append(
            f"Partial KV split: gpulayers {placement.n_gpu_layers} keeps the KV of the last "
            f"{config.kv_gpu_layers} layers in VRAM; overridetensors moves the weights of layers "
            f"{placement.override_layers[0]}-{placement.override_layers[-1]} to {gpu_buffer_type}, their KV stays in RAM. "
            "The same llama.cpp mechanism as llama-server's -ot: memory layout checked on a GPU (weights and KV per device as planned: docs/accuracy/gpu.md)."
        )
    if not config.swa_full:
        notes.append("useswa (small sliding-window cache) turns off koboldcpp's context shifting.")
    if config.n_seq > 1:
        notes.append(
            f"koboldcpp decodes one request at a time (multiuser only queues): {config.n_seq} parallel "
            "sequences cannot be set; the context is one stream of the same total size."
        )
    if config.n_gpu_layers != 0:
        notes.append(
            "The file does not choose the GPU backend (CUDA, Vulkan ...): pick it in the launcher "
            "(koboldcpp --config FILE --showgui) and save over this file."
        )
    return ExportResult(
        target="koboldcpp",
        text=json.dumps(settings, indent=2, ensure_ascii=False) + "\n",
        filename_suggestion=f"{safe_stem(model_path)}.kcpps",
        limitations=tuple(notes),
        experimental=experimental,
    )
