"""The catalogue of configuration fields: one entry per :class:`~kvtuner.core.plan.config.PlanConfig`
field, with every name it goes by.

The command line builds its flags from it, the app its labels and tooltips, the advisor its fix
labels and the exporters the flags and keys of each target, so a field is described once.
Flag spellings are llama.cpp's (common/arg.cpp ``common_params_parser_init``); Ollama parameter
names from its Modelfile reference (docs/modelfile.md, ``PARAMETER``); koboldcpp keys from its
``.kcpps`` settings (koboldcpp.py argparse destinations); llama-cpp-python keyword arguments
from ``llama_cpp.Llama.__init__``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from ..model.ggml_types import KV_CACHE_TYPES
from .config import ALL_LAYERS

KV_CACHE_TYPES_HELP = " ".join(KV_CACHE_TYPES)


@dataclass(frozen=True)
class ConfigField:
    """One configuration field and its names.

    Attributes:
        name: the :class:`PlanConfig` attribute (``n_ctx``).
        flag: kvtuner's long flag (``--ctx``); the CLI also accepts ``aliases``.
        aliases: llama.cpp's spellings that kvtuner accepts too (``-c``, ``--ctx-size``).
        llama_flag: the llama-server / llama-cli flag written by exports (``-c``); "" when the
            value is written another way (``-nkvo`` for ``kv_gpu_layers`` 0).
        kind: ``int``, ``layers`` (a whole number or ``all``), ``choice``, ``type`` (a KV
            cache type), ``switch`` (a flag without value), ``negated-switch`` (``--no-mmap``
            sets the field False) or ``list`` (a repeatable flag, comma-separated values:
            ``-ot``).
        label: the app's label, with its ``&`` mnemonic.
        help: one line for ``--help`` and the first line of the app's tooltip.
        detail: the formula behind it, for the tooltip (may be "").
        unit: ``tokens``, ``layers`` or "".
        choices: allowed values for ``choice``.
        llama_cpp_python: the ``Llama()`` keyword argument ("" if none).
        ollama: the Ollama Modelfile ``PARAMETER`` ("" if Ollama has none).
        koboldcpp: the koboldcpp ``.kcpps`` key ("" if none).
        phrase: how an advice button names a value (``"context {}"`` -> "Use context 8192").
    """

    name: str
    flag: str
    aliases: tuple[str, ...]
    llama_flag: str
    kind: str
    label: str
    help: str
    detail: str = ""
    unit: str = ""
    choices: tuple[str, ...] = ()
    llama_cpp_python: str = ""
    ollama: str = ""
    koboldcpp: str = ""
    phrase: str = ""

    @property
    def dest(self) -> str:
        """The argparse destination of :attr:`flag` (``--kv-gpu-layers`` -> ``kv_gpu_layers``)."""
        return self.flag.lstrip("-").replace("-", "_")

    def tooltip(self) -> str:
        """The app's tooltip: every flag spelling, the help line and the formula."""
        names: list[str] = []
        for n in (self.llama_flag, self.flag, *self.aliases):
            if n and n not in names:
                names.append(n)
        return f"{' / '.join(names)}: {self.help}" + (f"\n{self.detail}" if self.detail else "")

    def phrase_for(self, value: Any) -> str:
        """The words an advice button uses for this value (``"context 8192"``,
        ``"all layers and the output layer on the GPU"``)."""
        if self.kind == "layers" and value == ALL_LAYERS:
            return "all layers and the output layer on the GPU"
        if self.name == "kv_gpu_layers" and value is None:
            return "all offloaded layers' KV on the GPU"
        if self.kind in ("switch", "negated-switch"):
            return f"{self.label.replace('&', '').lower()} {'on' if value else 'off'}"
        return (self.phrase or self.name + " {}").format(value)

    def cli_text(self, value: Any) -> str:
        """The kvtuner flags that set this field to ``value`` (``--ngl all``, ``--swa-full``,
        ``(drop --kv-gpu-layers)`` for a default that has no flag)."""
        if self.kind == "switch":
            return self.flag if value else f"(drop {self.flag})"
        if self.kind == "negated-switch":
            return f"(drop {self.flag})" if value else self.flag
        if value is None:
            return f"(drop {self.flag})"
        if self.kind == "list":
            return " ".join(f"{self.flag} {shlex.quote(v)}" for v in value) if value else f"(drop {self.flag})"
        if self.kind == "layers" and value == ALL_LAYERS:
            return f"{self.flag} all"
        return f"{self.flag} {value}"


FIELDS: tuple[ConfigField, ...] = (
    ConfigField(
        "n_ctx",
        "--ctx",
        ("-c", "--ctx-size"),
        "-c",
        "int",
        "&Context (-c)",
        "context size in tokens for all sequences together (default 4096)",
        "llama.cpp pads it to a multiple of 256. KV cache = kv_bytes_per_token x n_ctx\n"
        "(sliding-window layers stop at n_swa + n_ubatch cells).",
        unit="tokens",
        llama_cpp_python="n_ctx",
        ollama="num_ctx",
        koboldcpp="contextsize",
        phrase="context {}",
    ),
    ConfigField(
        "n_gpu_layers",
        "--ngl",
        ("-ngl", "--n-gpu-layers", "--gpu-layers"),
        "-ngl",
        "layers",
        "&GPU layers (-ngl)",
        "layers whose weights go to the GPU, the output layer counted as one (default all)",
        "llama.cpp offloads the LAST layers: i_gpu_start = max(n_layer + 1 - ngl, 0) (llama-model.cpp load_tensors).\n"
        "'all' = n_layer + 1; ngl = n_layer keeps layer 0 on the CPU, not the output layer.",
        unit="layers",
        llama_cpp_python="n_gpu_layers",
        ollama="num_gpu",
        koboldcpp="gpulayers",
        phrase="{} GPU layers",
    ),
    ConfigField(
        "kv_gpu_layers",
        "--kv-gpu-layers",
        (),
        "",
        "int",
        "&KV layers on GPU",
        "offloaded layers that keep their KV cache in VRAM; 0 = -nkvo (default: all offloaded)",
        "'all' = llama.cpp's default (offload_kqv); 0 = -nkvo / --no-kv-offload (all KV in RAM).\n"
        "Between: -ngl for those layers plus -ot tensor overrides for the rest (their KV stays in RAM).\n"
        "KV bytes per layer = (row_size(ctk, n_embd_k_gqa) + row_size(ctv, n_embd_v_gqa)) x cells x streams.",
        unit="layers",
        llama_cpp_python="offload_kqv",
        koboldcpp="lowvram",
        phrase="KV of {} layers on the GPU",
    ),
    ConfigField(
        "type_k",
        "--cache-type-k",
        ("-ctk",),
        "-ctk",
        "type",
        "K cache &type",
        f"K cache type: {KV_CACHE_TYPES_HELP}",
        "Bytes per element: f32 4, f16/bf16 2, q8_0 34/32, q5_1 24/32, q5_0 22/32, q4_1 20/32, q4_0 and\n"
        "iq4_nl 18/32. K bytes = row_size(type, n_embd_k_gqa) x cells.",
        llama_cpp_python="type_k",
        koboldcpp="quantkv",
        phrase="K cache {}",
    ),
    ConfigField(
        "type_v",
        "--cache-type-v",
        ("-ctv",),
        "-ctv",
        "type",
        "V cache type",
        "V cache type (a quantized V needs flash attention)",
        "V bytes = row_size(type, n_embd_v_gqa) x cells.",
        llama_cpp_python="type_v",
        koboldcpp="quantkv",
        phrase="V cache {}",
    ),
    ConfigField(
        "flash_attn",
        "--flash-attn",
        ("-fa",),
        "-fa",
        "choice",
        "Fl&ash attention (-fa)",
        "flash attention on, off or auto (default auto)",
        "Needed for a quantized V cache; keeps V untransposed and shrinks the compute buffer\n"
        "(no n_kv x n_ubatch x n_head score matrix).",
        choices=("on", "off", "auto"),
        llama_cpp_python="flash_attn",
        koboldcpp="flashattention",
        phrase="flash attention {}",
    ),
    ConfigField(
        "n_seq",
        "--parallel",
        ("-np",),
        "-np",
        "int",
        "&Parallel seqs (-np)",
        "parallel sequences (default 1)",
        "Each gets its own KV stream of pad(n_ctx / np, 256) cells: the same total KV, split;\n"
        "with --kv-unified one shared buffer.",
        llama_cpp_python="n_seq_max",
        ollama="",
        koboldcpp="",
        phrase="{} sequence(s)",
    ),
    ConfigField(
        "n_ubatch",
        "--ubatch",
        ("-ub", "--ubatch-size"),
        "-ub",
        "int",
        "&Ubatch (-ub)",
        "physical batch size in tokens (default 512)",
        "Sizes the compute buffer (logits n_vocab x n_ubatch x 4 bytes, attention scores without\nflash attention).",
        unit="tokens",
        llama_cpp_python="n_ubatch",
        ollama="num_batch",
        koboldcpp="batchsize",
        phrase="n_ubatch {}",
    ),
    ConfigField(
        "n_batch",
        "--batch",
        ("-b", "--batch-size"),
        "-b",
        "int",
        "&Batch (-b)",
        "logical batch size in tokens (default 2048)",
        unit="tokens",
        llama_cpp_python="n_batch",
        phrase="n_batch {}",
    ),
    ConfigField(
        "swa_full",
        "--swa-full",
        (),
        "--swa-full",
        "switch",
        "Full-size &SWA cache",
        "full-size cache for sliding-window layers",
        llama_cpp_python="swa_full",
    ),
    ConfigField(
        "kv_unified",
        "--kv-unified",
        ("-kvu",),
        "-kvu",
        "switch",
        "&Unified KV",
        "one KV buffer for all sequences",
        llama_cpp_python="kv_unified",
    ),
    ConfigField(
        "use_mmap",
        "--no-mmap",
        (),
        "--no-mmap",
        "negated-switch",
        "Memory-&map weights",
        "read weights into RAM instead of memory-mapping them",
        llama_cpp_python="use_mmap",
        ollama="use_mmap",
        koboldcpp="usemmap",
    ),
    ConfigField(
        "n_cpu_moe",
        "--n-cpu-moe",
        ("-ncmoe",),
        "--n-cpu-moe",
        "int",
        "MoE &experts on CPU",
        "MoE layers with experts on CPU: keep the MoE expert weights of the first N layers in host RAM (default 0)",
        "llama.cpp adds -ot blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU for each layer i < N\n"
        "(common/common.h llm_add_n_cpu_ffn_overrides): attention, KV and the dense part stay in VRAM;\n"
        "a token reads n_expert_used / n_expert of those experts from RAM, computed by the CPU.",
        unit="layers",
        koboldcpp="moecpu",
        phrase="experts of {} layers on the CPU",
    ),
    ConfigField(
        "cpu_moe",
        "--cpu-moe",
        ("-cmoe",),
        "--cpu-moe",
        "switch",
        "All MoE experts on CPU",
        "keep the MoE expert weights of every layer in host RAM",
        "llama.cpp's -ot \\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU (common/common.h llm_ffn_exps_cpu_override).",
    ),
    ConfigField(
        "n_cpu_ffn",
        "--n-cpu-ffn",
        ("-ncffn",),
        "--n-cpu-ffn",
        "int",
        "Dense FFN on CPU",
        "keep the dense FFN weights of the first N layers in host RAM (default 0)",
        "llama.cpp adds -ot blk\\.i\\.ffn_(up|down|gate)\\.=CPU for each layer i < N (common/common.h\n"
        "LLM_FFN_DENSE_REGEX): attention and KV stay in VRAM, the CPU computes those FFNs.",
        unit="layers",
        phrase="FFN of {} layers on the CPU",
    ),
    ConfigField(
        "tensor_overrides",
        "--override-tensor",
        ("-ot",),
        "-ot",
        "list",
        "Tensor overrides (-ot)",
        "PATTERN=BUFFER: put tensors whose name matches the regex in BUFFER (CPU, CUDA0 ...); repeatable, comma-separated",
        "llama.cpp takes the first pattern std::regex_search finds in the tensor name (llama-model-loader.cpp);\n"
        "names look like blk.12.ffn_up_exps.weight.",
    ),
)

_BY_NAME = {f.name: f for f in FIELDS}


def config_field(name: str) -> ConfigField:
    """The catalogue entry of a :class:`PlanConfig` field.

    Raises:
        KeyError: ``name`` is not a configuration field.
    """
    return _BY_NAME[name]


def cli_flags(changes: dict[str, Any]) -> str:
    """The kvtuner flags of a set of changes: ``{"n_ubatch": 256, "flash_attn": "on"}`` ->
    ``"--ubatch 256 --flash-attn on"``.

    Raises:
        KeyError: a key that is not a configuration field.
    """
    return " ".join(config_field(k).cli_text(v) for k, v in changes.items())


#: The flags of what llama-server loads besides the main model (:class:`kvtuner.core.plan.extras.ExtrasConfig`
#: attributes): llama.cpp b11434's spellings first (common/arg.cpp), older spellings as aliases.
EXTRA_FIELDS: tuple[ConfigField, ...] = (
    ConfigField(
        "mmproj",
        "--mmproj",
        ("-mm",),
        "--mmproj",
        "path",
        "Pro&jector (--mmproj)",
        "vision/audio projector GGUF loaded beside the model (multimodal)",
        "Weights on the first GPU unless --no-mmproj-offload (tools/mtmd/clip.cpp); one image takes\n"
        "(image_size / patch_size)^2 / merge^2 context tokens.",
    ),
    ConfigField(
        "mmproj_offload",
        "--no-mmproj-offload",
        (),
        "--no-mmproj-offload",
        "negated-switch",
        "Projector on GPU",
        "keep the projector on the CPU",
    ),
    ConfigField(
        "draft",
        "--spec-draft-model",
        ("-md", "--model-draft"),
        "-md",
        "path",
        "Draft model (-&md)",
        "draft model GGUF for speculative decoding (same vocabulary as the model)",
        "Its own weights, KV cache at the main context (same -c, -np, -ub) and compute buffer\n"
        "(common/speculative.cpp common_base_params_to_speculative).",
    ),
    ConfigField(
        "draft_gpu_layers",
        "--spec-draft-ngl",
        ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
        "-ngld",
        "layers",
        "Draft GPU layers (-ngld)",
        "layers of the draft model on the GPU (default all)",
        unit="layers",
    ),
    ConfigField(
        "draft_type_k",
        "--spec-draft-type-k",
        ("-ctkd", "--cache-type-k-draft"),
        "-ctkd",
        "type",
        "Draft K cache type",
        f"the draft's K cache type (default f16): {KV_CACHE_TYPES_HELP}",
    ),
    ConfigField(
        "draft_type_v",
        "--spec-draft-type-v",
        ("-ctvd", "--cache-type-v-draft"),
        "-ctvd",
        "type",
        "Draft V cache type",
        "the draft's V cache type (default f16)",
    ),
    ConfigField(
        "draft_tensor_overrides",
        "--spec-draft-override-tensor",
        ("-otd", "--override-tensor-draft"),
        "-otd",
        "list",
        "Draft tensor overrides (-otd)",
        "PATTERN=BUFFER tensor overrides of the draft model (as -ot, for the draft)",
    ),
    ConfigField(
        "draft_cpu_moe",
        "--spec-draft-cpu-moe",
        ("-cmoed", "--cpu-moe-draft"),
        "-cmoed",
        "switch",
        "Draft MoE experts on CPU",
        "keep the draft model's MoE expert weights in host RAM",
    ),
    ConfigField(
        "draft_n_max",
        "--spec-draft-n-max",
        ("--draft-max", "--draft", "--draft-n"),
        "--spec-draft-n-max",
        "int",
        "Drafted tokens per step",
        "tokens drafted per speculative step (default 3; older builds: --draft-max)",
        "Sizes the speculative speed range: a step drafts n tokens and checks them in one batch of n + 1.",
    ),
    ConfigField(
        "draft_ctx",
        "--ctx-size-draft",
        ("-cd",),
        "-cd",
        "int",
        "Draft context (-cd)",
        "the draft's own context in tokens (builds before the --spec-* renames; b11434 has no -cd: "
        "the draft follows -c)",
        unit="tokens",
    ),
    ConfigField(
        "loras",
        "--lora",
        (),
        "--lora",
        "list",
        "LoRA adapters (--lora)",
        "LoRA adapter GGUF applied to the model (repeatable; FILE or FILE:SCALE, scale 1 by default)",
        "Each lora_a/lora_b tensor sits on the device of the layer it adapts (src/llama-adapter.cpp).",
    ),
)
