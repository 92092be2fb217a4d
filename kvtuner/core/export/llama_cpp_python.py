"""llama-cpp-python: ``Llama()`` keyword arguments (JSON) and a runnable snippet.

``Llama.__init__`` of llama-cpp-python 0.3.36 (llama_cpp/llama.py) takes n_gpu_layers (-1 =
all), n_ctx, n_batch, n_ubatch, offload_kqv, flash_attn (a bool: ENABLED or DISABLED, no
auto), swa_full (None keeps the C default, which is TRUE), type_k/type_v (ggml type ids),
use_mmap. It has no tensor overrides, no n_seq_max (one sequence unless embedding) and no
kv_unified; unknown keyword arguments are silently ignored, so we never pass any.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..model.ggml_types import kv_type
from ..plan.config import ALL_LAYERS, PlanConfig
from ..plan.placement import tensor_overrides
from ._common import ExportResult, check_path_text, kv_placement, safe_stem


def kwargs_for(model_path: Path, config: PlanConfig, n_layer: Callable[[], int]) -> tuple[dict[str, Any], list[str]]:
    """``Llama(**kwargs)`` for ``config`` and what it cannot express (one sentence each).

    Raises:
        ExportError: ``kv_gpu_layers`` impossible for the model, or an unusable path.
    """
    path_text = check_path_text(model_path)
    placement = kv_placement(config, n_layer)
    notes: list[str] = []
    ngl = placement.n_gpu_layers
    if placement.mode == "split":
        notes.append(
            f"Llama() has no tensor overrides, so the partial KV split cannot be expressed: it offloads only "
            f"{ngl - 1} layers + output (n_gpu_layers={ngl}), all with their KV in VRAM; the weights of layers "
            f"{placement.override_layers[0]}-{placement.override_layers[-1]} stay in RAM (less VRAM, slower)."
        )
    ot = tensor_overrides(config)
    if ot:
        notes.append(
            "Llama() has no tensor overrides (llama_model_params.tensor_buft_overrides is unused by it), so "
            + ", ".join(_override_words(config))
            + " cannot be expressed with Llama(): these kwargs load every "
            "expert where its layer goes (more VRAM); the llama-cpp-python snippet export adds the low-level "
            "loader that applies them."
        )
    if config.flash_attn == "auto":
        notes.append(
            "Llama(flash_attn=...) is a bool: 'auto' is written as True (what auto picks where the backend "
            "supports flash attention); set False if yours does not and keep V at f16."
        )
    if config.n_seq > 1:
        notes.append(
            f"Llama() decodes one sequence (no n_seq_max): the {config.n_ctx}-token context is one stream "
            f"instead of {config.n_seq} parallel ones (same KV bytes in total)."
        )
    kwargs: dict[str, Any] = {
        "model_path": path_text,
        "n_ctx": config.n_ctx,
        "n_gpu_layers": -1 if ngl == ALL_LAYERS else ngl,
        "n_batch": config.n_batch,
        "n_ubatch": config.n_ubatch,
        "flash_attn": config.flash_attn != "off",
        "offload_kqv": placement.mode != "host",
        "swa_full": config.swa_full,
        "type_k": kv_type(config.type_k).ggml_id,
        "type_v": kv_type(config.type_v).ggml_id,
        "use_mmap": config.use_mmap,
    }
    return kwargs, notes


def _override_words(config: PlanConfig) -> list[str]:
    out = [f"-ot {t}" for t in config.tensor_overrides]
    if config.cpu_moe:
        out.append("--cpu-moe")
    if config.n_cpu_moe:
        out.append(f"--n-cpu-moe {config.n_cpu_moe}")
    if config.n_cpu_ffn:
        out.append(f"--n-cpu-ffn {config.n_cpu_ffn}")
    return out


#: The low-level part the snippet adds when the configuration has tensor overrides: llama.h's
#: ``llama_model_tensor_buft_override`` array (NULL-terminated ``{pattern, buft}``) with buffer
#: types from libggml's device registry (ggml-backend.h ``ggml_backend_dev_by_name`` /
#: ``ggml_backend_dev_buffer_type``), put into the ``llama_model_params`` that ``Llama.__init__``
#: takes from ``llama_cpp.llama_cpp.llama_model_default_params()`` (llama.py of 0.3.36: it sets
#: no ``tensor_buft_overrides`` of its own, so the array reaches ``llama_model_load_from_file``).
_LOW_LEVEL = """
import ctypes
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as _lc


class _Override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def llama_with_overrides(kwargs, overrides):
    \"\"\"Llama(**kwargs) with llama.cpp tensor buffer-type overrides [(regex, "CPU" | "CUDA0" ...)].\"\"\"
    try:
        from llama_cpp._ggml import libggml as lib
    except Exception:
        lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml.so"))
    lib.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    arr = (_Override * (len(overrides) + 1))()
    for i, (pattern, device) in enumerate(overrides):
        dev = lib.ggml_backend_dev_by_name(device.encode())
        if not dev:
            raise SystemExit(f"this llama.cpp build has no device {device}")
        arr[i].pattern, arr[i].buft = pattern.encode(), lib.ggml_backend_dev_buffer_type(dev)
    default = _lc.llama_model_default_params

    def with_overrides():
        mp = default()
        mp.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p).value
        return mp

    _lc.llama_model_default_params = with_overrides
    try:
        llm = Llama(**kwargs, verbose=False)
    finally:
        _lc.llama_model_default_params = default
    llm._kvtuner_overrides = arr  # the model keeps pointers into it while loaded
    return llm
"""


def render_json(model_path: Path, config: PlanConfig, n_layer: Callable[[], int]) -> ExportResult:
    """The kwargs as a JSON object (``Llama(**json.load(f))``)."""
    kwargs, notes = kwargs_for(model_path, config, n_layer)
    text = json.dumps(kwargs, indent=2, ensure_ascii=False) + "\n"
    return ExportResult(
        target="llama-cpp-python-json",
        text=text,
        filename_suggestion=f"{safe_stem(model_path)}.llama-cpp-python.json",
        limitations=tuple(notes),
    )


def render_snippet(model_path: Path, config: PlanConfig, n_layer: Callable[[], int]) -> ExportResult:
    """A Python script that loads the model with these kwargs and generates a few tokens."""
    kwargs, notes = kwargs_for(model_path, config, n_layer)
    lines = [
        "# kvtuner export for llama-cpp-python (tested with 0.3.36): pip install llama-cpp-python",
    ]
    for note in notes:
        lines.append(f"# NOTE: {note}")
    ot = tensor_overrides(config)
    lines += ["from llama_cpp import Llama"]
    if ot:
        lines += _LOW_LEVEL.splitlines()
        lines += [
            "# " + " ".join(_override_words(config)) + " (llama.cpp's patterns, first match wins)",
            f"OVERRIDES = {[list(o) for o in ot]!r}",
        ]
    lines += [
        "",
        "KWARGS = {",
    ]
    for key, value in kwargs.items():
        comment = ""
        if key in ("type_k", "type_v"):
            comment = f"  # {getattr(config, key)} (ggml type id)"
        lines.append(f"    {key!r}: {value!r},{comment}")
    lines += [
        "}",
        "",
        'if __name__ == "__main__":',
        "    llm = llama_with_overrides(KWARGS, OVERRIDES)" if ot else "    llm = Llama(**KWARGS, verbose=False)",
        '    out = llm.create_completion("The capital of France is", max_tokens=8)',
        '    print(out["choices"][0]["text"])',
        "",
    ]
    return ExportResult(
        target="llama-cpp-python",
        text="\n".join(lines),
        filename_suggestion=f"{safe_stem(model_path)}_llama_cpp_python.py",
        limitations=tuple(notes),
    )
