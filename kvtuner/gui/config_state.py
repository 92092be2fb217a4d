"""The one configuration behind the window: what the controls show is what is planned, run and
exported.

The window keeps two things: what the user asked for (every control's value, kept while a
control does not apply so that it comes back when it applies again) and the *effective*
configuration, :func:`effective_config`: the asked-for one with every value that does not apply
to the hardware planned for replaced by the value llama.cpp really gets. The controls show the
effective one (a control that does not apply reads "n/a" and says why); the plan, the speed
prediction, the badge, the advice, Run and Export all take it.

:func:`gui_wording` turns a :class:`~kvtuner.core.plan.config.ConfigError` (worded for the command
line) into words about the window's controls, and :func:`fix_for_error` finds the one-click fix
for the refusals that have one.

Sources: a CPU-only plan keeps every layer on the CPU whatever ``n_gpu_layers`` says
(llama-model.cpp ``load_tensors``: without a GPU device every layer's buffer type is the CPU's),
so the effective ``n_gpu_layers`` is 0; ``kv_gpu_layers`` chooses among the repeating layers
``-ngl`` offloads (:func:`kvtuner.core.plan.placement.offloaded_repeating_layers`, llama-model.cpp
``load_tensors``: ``min(ngl, n_layer + 1) - 1``), so with none offloaded it does not apply, and a
value at or above the offloaded count is "all" (:func:`kvtuner.core.plan.placement.placement_for`
treats ``kv == n_off`` as ``None``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.plan.config import ALL_LAYERS, PlanConfig
from ..core.plan.fields import FIELDS, config_field
from ..core.plan.placement import offloaded_repeating_layers


@dataclass(frozen=True)
class Effective:
    """The effective configuration and the controls that do not apply.

    Attributes:
        config: what is planned, run and exported.
        not_applicable: PlanConfig field name -> why its control does not apply (one line).
    """

    config: PlanConfig
    not_applicable: dict[str, str]


def effective_config(wanted: PlanConfig, n_layer: int, gpus: Sequence[Any]) -> Effective:
    """``wanted`` as it applies to ``gpus`` (the devices planned for; empty: CPU only) for a
    model of ``n_layer`` repeating layers (0: no model open, nothing is changed).

    * no GPU: ``n_gpu_layers`` 0, ``kv_gpu_layers`` None and no MoE experts or dense FFN moved (all not
      applicable);
    * ``-ngl`` offloads no repeating layer: ``kv_gpu_layers`` None (not applicable);
    * ``kv_gpu_layers`` at or above the offloaded repeating layers: None ("all" of them).
    """
    na: dict[str, str] = {}
    cfg = wanted
    if n_layer <= 0:
        return Effective(cfg, na)
    if not gpus:
        na["n_gpu_layers"] = "CPU only: every layer stays on the CPU"
        na["kv_gpu_layers"] = "CPU only: every layer's KV cache is in RAM"
        na["n_cpu_moe"] = "CPU only: every expert is in RAM already"
        na["n_cpu_ffn"] = "CPU only: every FFN is in RAM already"
        return Effective(cfg.with_(n_gpu_layers=0, kv_gpu_layers=None, n_cpu_moe=0, cpu_moe=False, n_cpu_ffn=0), na)
    n_off = offloaded_repeating_layers(cfg.n_gpu_layers, n_layer)
    if n_off == 0:
        na["kv_gpu_layers"] = "no repeating layer is on the GPU (raise GPU layers)"
        if cfg.kv_gpu_layers is not None:
            cfg = cfg.with_(kv_gpu_layers=None)
    elif cfg.kv_gpu_layers is not None and cfg.kv_gpu_layers >= n_off:
        cfg = cfg.with_(kv_gpu_layers=None)
    return Effective(cfg, na)


def _label(name: str) -> str:
    return config_field(name).label.replace("&", "")


def _assignment(name: str, text: str) -> str:
    """``name = text`` from a message as ``Label: value`` (a number read as one)."""
    value: Any = int(text) if re.fullmatch(r"-?\d+", text) else (None if text == "None" else text)
    return f"{_label(name)}: {value_wording(name, value)}"


def value_wording(name: str, value: Any) -> str:
    """A PlanConfig value as its control shows it: ``all`` for every layer (or every offloaded
    layer's KV), ``on``/``off`` for a switch, the unit after a count (``30 layers``,
    ``8192 tokens``)."""
    f = config_field(name)
    if value is None or (f.kind == "layers" and value == ALL_LAYERS):
        return "all"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value) or "none"
    return f"{value} {f.unit}" if f.unit and isinstance(value, int) else str(value)


def fix_wording(changes: dict[str, Any]) -> str:
    """PlanConfig changes in control names: ``{"n_cpu_ffn": 30, "type_k": "q8_0"}`` ->
    ``Dense FFN on CPU: 30 layers, K cache type: q8_0``."""
    return ", ".join(
        f"{_label(k)}: {value_wording(k, v)}" if k in _FIELD_NAMES else f"{k}: {v}" for k, v in changes.items()
    )


_FIELD_NAMES = frozenset(f.name for f in FIELDS)


def gui_wording(message: str) -> str:
    """A message worded for the window: every command-line flag (``--flash-attn``, ``-ctk`` ...)
    and every configuration field name (``n_ubatch``; ``n_cpu_ffn = 30``) becomes the name of
    its control (``"Flash attention (-fa)"``; ``Dense FFN on CPU: 30 layers``)."""
    names = {flag: f.name for f in FIELDS for flag in (f.flag, *f.aliases)}
    pattern = "|".join(re.escape(flag) for flag in sorted(names, key=len, reverse=True))
    text = re.sub(rf"(?<![\w-])({pattern})(?![\w-])", lambda m: f'"{_label(names[m.group(1)])}"', message)
    # a run of flags (a fix written as a command line) becomes a list: "A" 1, "B" 2
    labels = "|".join(re.escape(_label(f.name)) for f in FIELDS)
    text = re.sub(rf'("(?:{labels})"(?: [^\s",:;]+)?) (?="(?:{labels})")', r"\1, ", text)
    fields = "|".join(sorted(_FIELD_NAMES, key=len, reverse=True))
    text = re.sub(rf"\b({fields}) ?= ?(-?\w+)", lambda m: _assignment(m.group(1), m.group(2)), text)
    text = re.sub(rf"\b({fields})\b", lambda m: f'"{_label(m.group(1))}"', text)
    text = text.replace('"Context (-c)" 0', '"Context (-c)" at the training context')
    text = re.sub(r"give --gpu-mem to plan a what-if GPU", 'choose a what-if card in "Plan for"', text)
    text = re.sub(r"plan a what-if card with --gpu-mem \S+", 'choose a what-if card in "Plan for"', text)
    text = re.sub(r"--gpu-mem( \S+)?", 'a what-if card in "Plan for"', text)
    text = text.replace("plan --verify", '"Verify with llama.cpp"')
    # a tune the command line would run is the Tune dialog here
    text = re.sub(r"kvtuner tune --kv-quality (\S+?)(?=[).,;]|$| )", r'Tune..., "KV quality floor" \1', text)
    return text


#: Refusals with a one-click fix: (pattern of the ConfigError's message, button text, changes).
_FIXES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (r"quantized V cache .* requires flash attention", "Turn flash attention on", {"flash_attn": "on"}),
    (r"needs the same K and V cache type", "Use the K type for V too", {"type_v": None}),
    (r"exceeds the \d+ repeating layers offloaded", "Put KV of all GPU layers on the GPU", {"kv_gpu_layers": None}),
)


def fix_for_error(message: str, values: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The one-click fix for a refusal: ``(button text, PlanConfig changes)``, or None.

    ``values``: the controls' values (PlanConfig keyword arguments) that were refused; a change
    of None for ``type_v`` means "the K type".
    """
    for pattern, text, changes in _FIXES:
        if re.search(pattern, message):
            out = dict(changes)
            if "type_v" in out and out["type_v"] is None:
                out["type_v"] = values.get("type_k", "f16")
            return text, out
    return None
