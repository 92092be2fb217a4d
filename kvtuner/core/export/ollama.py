"""Ollama: a Modelfile plus the server environment it needs.

Sources: Ollama's Modelfile parser (parser/parser.go: ``FROM`` path, ``PARAMETER name value``,
values may be wrapped in ``"..."`` or ``\"\"\"...\"\"\"``, ``#`` comment lines), its runner (the
llama.cpp context gets ``n_ubatch = num_batch``, ``n_ctx = num_ctx x OLLAMA_NUM_PARALLEL``) and
its server settings (``OLLAMA_FLASH_ATTENTION``, ``OLLAMA_KV_CACHE_TYPE`` = f16 | q8_0 | q4_0 for
K and V together, needs flash attention; ``OLLAMA_NUM_PARALLEL``). Server settings apply to
every model that server runs, not to this one alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from ..plan.config import ALL_LAYERS, PlanConfig
from ._common import ExportError, ExportResult, check_path_text, kv_placement, safe_stem
from .koboldcpp import nearest_shared_kv_type

#: KV types OLLAMA_KV_CACHE_TYPE accepts.
OLLAMA_KV_TYPES = ("f16", "q8_0", "q4_0")
#: num_gpu meaning "every layer" (more than any model has; llama.cpp clamps to n_layer + 1).
ALL_LAYERS_NUM_GPU = 999


def _modelfile_value(text: str) -> str:
    """Quote a value for the Modelfile parser (parser.go ``unquote``)."""
    # ParseFile keeps only strconv.IsPrint runes (letters, marks, numbers, punctuation, symbols and
    # the ASCII space): a no-break space or zero-width joiner would silently vanish from the path.
    # Python's str.isprintable() is the same set.
    if not text.isprintable():
        raise ExportError(
            f"model path {text!r} has control or invisible characters a Modelfile cannot hold "
            "(Ollama drops them): rename the file"
        )
    if '"""' in text:
        raise ExportError(f'model path {text!r} contains \'"""\', which a Modelfile cannot quote: rename the file')
    if '"' in text:
        return f'"""{text}"""'
    return f'"{text}"'


def render(model_path: Path, config: PlanConfig, n_layer: Callable[[], int]) -> ExportResult:
    """Modelfile text (with the server environment as comments) and ``env``.

    Raises:
        ExportError: an unusable path or an impossible ``kv_gpu_layers``.
    """
    path_text = check_path_text(model_path)
    placement = kv_placement(config, n_layer)
    notes: list[str] = []
    env: dict[str, str] = {}

    # KV cache type: one type for K and V
    kv = nearest_shared_kv_type(config.type_k, config.type_v, OLLAMA_KV_TYPES)
    if (config.type_k, config.type_v) != (kv, kv):
        notes.append(
            f"Ollama has one KV cache type for K and V ({', '.join(OLLAMA_KV_TYPES)}): "
            f"K {config.type_k} / V {config.type_v} becomes {kv} for both (no more memory than planned)."
        )
    env["OLLAMA_KV_CACHE_TYPE"] = kv
    # flash attention: a server-wide switch; a quantized cache needs it
    if config.flash_attn == "on" or kv != "f16":
        env["OLLAMA_FLASH_ATTENTION"] = "1"
        if config.flash_attn == "off":
            notes.append("Ollama ignores a quantized KV cache without flash attention: flash attention is switched on.")
    elif config.flash_attn == "off":
        env["OLLAMA_FLASH_ATTENTION"] = "0"
    else:
        notes.append("flash attention 'auto': OLLAMA_FLASH_ATTENTION is left unset, Ollama decides per model.")
    env["OLLAMA_NUM_PARALLEL"] = str(config.n_seq)
    if config.n_cpu_moe or config.cpu_moe or config.n_cpu_ffn or config.tensor_overrides:
        # Ollama's Modelfile PARAMETERs (docs/modelfile.md) and server variables have no tensor
        # override: it places whole layers by num_gpu only
        notes.append(
            "Ollama cannot keep MoE experts (or any tensor) in RAM while their layer is on the GPU: "
            "--n-cpu-moe / --cpu-moe / --n-cpu-ffn / -ot are not expressible; num_gpu moves whole layers instead "
            "(more VRAM per layer, slower decode than the plan's expert offload)."
        )

    num_ctx = config.n_ctx // config.n_seq
    if config.n_seq > 1 and num_ctx * config.n_seq != config.n_ctx:
        notes.append(
            f"num_ctx is per parallel request in Ollama: {config.n_ctx} tokens / {config.n_seq} = {num_ctx} each."
        )

    # -ngl 0 or 1 offloads no repeating layer (the output layer is offloaded first): no KV on the GPU anyway
    if placement.mode == "host" and (config.n_gpu_layers == ALL_LAYERS or config.n_gpu_layers > 1):
        notes.append(
            "Ollama cannot keep the KV cache in RAM while layers are on the GPU (no -nkvo): "
            "the KV of offloaded layers goes to VRAM, more than planned."
        )
    if placement.mode == "split":
        notes.append(
            "Ollama cannot split weights and KV (no tensor overrides): num_gpu is the number of layers whose "
            f"KV stays in VRAM ({placement.n_gpu_layers}); the other layers' weights stay in RAM (slower)."
        )
        num_gpu = placement.n_gpu_layers
    else:
        num_gpu = ALL_LAYERS_NUM_GPU if config.n_gpu_layers == ALL_LAYERS else config.n_gpu_layers
    if config.swa_full:
        notes.append("Ollama sizes sliding-window caches itself: --swa-full cannot be requested.")
    if config.kv_unified and config.n_seq > 1:
        notes.append("Ollama has no unified KV cache option: each parallel request gets its own num_ctx.")
    notes.append(
        "OLLAMA_* settings apply to the whole Ollama server: set them where 'ollama serve' starts "
        "(systemd unit, launchd, Windows environment) and restart it."
    )

    name = safe_stem(model_path).lower()
    env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    lines = [
        "# kvtuner export for Ollama.",
        "# 1. Start the Ollama server with this environment:",
        f"#      {env_line} ollama serve",
        "# 2. Create the model from this file:",
        f"#      ollama create {name}-kvtuner -f Modelfile",
    ]
    for note in notes:
        lines.append(f"# NOTE: {note}")
    lines += [
        f"FROM {_modelfile_value(path_text)}",
        f"PARAMETER num_ctx {num_ctx}",
        f"PARAMETER num_gpu {num_gpu}",
        # Ollama sets n_batch = n_ubatch = num_batch; llama.cpp would clamp -ub to -b
        f"PARAMETER num_batch {min(config.n_batch, config.n_ubatch)}",
    ]
    if not config.use_mmap:
        lines.append("PARAMETER use_mmap false")
    return ExportResult(
        target="ollama",
        text="\n".join(lines) + "\n",
        filename_suggestion="Modelfile",
        limitations=tuple(notes),
        env=env,
    )
