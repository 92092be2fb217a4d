"""MoE expert shapes: the key a MoE layer's experts go by in the CPU probe's tables and in the
speed model's workload (width, expert FFN width, experts, experts per token and the
gate/up/down types, ``"2048/768/128/8@Q4_K"``), read from a GGUF tensor table
(``blk.N.ffn_{gate,up,down}_exps.weight``, llama-arch.cpp ``LLM_TENSOR_FFN_*_EXPS``).

Its own module because both :mod:`.weights` (which tags each layer's experts) and
:mod:`.cpu_probe` (which times each shape, and reads :mod:`.weights`) need it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import gguf


def expert_key(n_embd: int, n_ff_exp: int, n_expert: int, n_expert_used: int, types: Sequence[str]) -> str:
    """The key of a MoE expert shape in the probe's tables: ``"2048/768/128/8@Q4_K"`` (width,
    expert FFN width, experts, experts per token; the type of ``ffn_gate_exps``, ``ffn_up_exps``
    and ``ffn_down_exps``, one name when they are alike, else ``"@Q4_K,Q4_K,Q6_K"``)."""
    ts = [str(t).upper() for t in types]
    kind = ts[0] if len(set(ts)) == 1 else ",".join(ts)
    return f"{int(n_embd)}/{int(n_ff_exp)}/{int(n_expert)}/{int(n_expert_used)}@{kind}"


def parse_expert_key(key: str) -> tuple[int, int, int, int, tuple[str, str, str]] | None:
    """``(n_embd, n_ff_exp, n_expert, n_expert_used, (gate, up, down types))`` of an
    :func:`expert_key`, or None when ``key`` is not one."""
    shape, _, kind = key.partition("@")
    parts = shape.split("/")
    ts = [t.strip().upper() for t in kind.split(",")] if kind else []
    if len(parts) != 4 or not all(p.isdigit() for p in parts) or len(ts) not in (1, 3) or not all(ts):
        return None
    if len(ts) == 1:
        ts = ts * 3
    return int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), (ts[0], ts[1], ts[2])


_EXPS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")


def model_expert_keys(model: Any) -> tuple[str | None, ...]:
    """Per repeating layer of ``model`` (a :class:`~kvtuner.core.model.profile.ModelProfile`) the
    :func:`expert_key` of its experts, from its tensor table (``blk.N.ffn_{gate,up,down}_exps``:
    ggml shapes ``[n_embd, n_ff_exp, n_expert]`` and ``[n_ff_exp, n_embd, n_expert]``); None for
    a layer without them (dense layers, fused gate/up experts, a profile without a tensor table,
    an MTP/NextN block the loader skips: ``structure.skipped_layer_bytes``)."""
    structure = getattr(model, "structure", None)
    n_layer = int(getattr(model, "n_layer", 0) or 0)
    return expert_keys_of(
        getattr(model, "tensors", ()) or (),
        n_layer,
        int(getattr(model, "n_expert_used", 0) or 0),
        tuple(structure.is_skipped(il) for il in range(n_layer)) if structure is not None else (),
    )


def expert_keys_of(
    tensors: Sequence[Any], n_layer: int, n_expert_used: int, skipped: tuple[bool, ...] = ()
) -> tuple[str | None, ...]:
    """:func:`model_expert_keys` from a tensor table (``TensorInfo``: ``name``, ``shape``, ``ggml_type``);
    ``skipped``: per layer, whether the loader skips it (None for those)."""
    found: list[dict[str, tuple[tuple[int, ...], str]]] = [{} for _ in range(n_layer)]
    for t in tensors:
        m = _EXPS.match(t.name)
        il = int(m.group(1)) if m else -1
        if m and il < n_layer and not (il < len(skipped) and skipped[il]) and len(t.shape) == 3:
            try:
                name = gguf.GGMLQuantizationType(t.ggml_type).name
            except ValueError:
                name = f"type{t.ggml_type}"
            found[int(m.group(1))][m.group(2)] = (tuple(t.shape), name)
    k = n_expert_used
    out: list[str | None] = []
    for f in found:
        if set(f) != {"gate", "up", "down"} or not k:
            out.append(None)
            continue
        e, ff, n = f["gate"][0]
        down = f["down"][0]
        alike = f["up"][0] == f["gate"][0] and (down[1], down[0], down[2]) == (e, ff, n)
        out.append(expert_key(e, ff, n, k, (f["gate"][1], f["up"][1], f["down"][1])) if alike else None)
    return tuple(out)
