"""The structure probe: a model's per-layer memory structure as the installed llama.cpp builds it.

A dry run (no_alloc load + context) logs, besides its sizes, one DEBUG line per layer that gets
a K/V entry (``llama_kv_cache: layer %3d: dev = %s``, llama-kv-cache.cpp constructor), one per
layer reading another's KV (``- layer %3d: reuse layer %d, is_swa = %d``), the iSWA split
(``llama_kv_cache_iswa: creating non-SWA / SWA KV cache``, llama-kv-cache-iswa.cpp), one per
recurrent layer (``llama_memory_recurrent, layer %3d: dev = %s``, llama-memory-recurrent.cpp),
and ``print_info`` lines with the per-layer K/V widths, head sizes, ``n_layer`` (trunk) and
``n_swa`` (llama-model.cpp ``print_info``). :func:`collect_facts` (in the runner's child) keeps
those facts as a JSON-able dict; :func:`structure_from_facts` (in the parent) turns them into
a :class:`~kvtuner.core.model.structure.ModelStructure` with ``source="probe"``.

The recurrent state width per row (``n_embd_r``, ``n_embd_s``) is not printed per layer: the
probe takes the analytic widths when they reproduce llama.cpp's printed R and S sizes (to the
0.005 MiB of the print), else the widths the printed sizes imply (rounded, and noted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from ..core.model.structure import LayerRole, ModelStructure, differences  # noqa: F401 (re-exported)
from ..core.units import MiB
from . import llama_log as L

#: the structure records the worker keeps from DEBUG lines (everything else at DEBUG is dropped)
DEBUG_RECORDS = (L.KvLayer, L.KvReuse, L.RecurrentLayer)


def collect_facts(records: Iterable[L.Record]) -> dict[str, Any] | None:
    """The structure facts of one dry run's log records (None when the log has no print_info).

    Returns:
        ``{n_layer, n_layer_all, n_swa, head_k, head_v, head_k_swa, head_v_swa, k_gqa, v_gqa,
        iswa, kv: [[il, dev, section]], reuse: [[il, src, swa]], recurrent: [[il, dev]]}``.
    """
    info: dict[str, str] = {}
    kv: list[list[Any]] = []
    reuse: list[list[Any]] = []
    rec: list[list[Any]] = []
    section = ""
    iswa = False
    for r in records:
        if isinstance(r, L.ModelInfo):
            info[r.name] = r.value
        elif isinstance(r, L.IswaSection):
            section, iswa = r.kind, True
        elif isinstance(r, L.KvLayer):
            kv.append([r.il, r.dev, section])
        elif isinstance(r, L.KvReuse):
            reuse.append([r.il, r.src, r.swa])
        elif isinstance(r, L.RecurrentLayer):
            rec.append([r.il, r.dev])
    if "n_layer_all" not in info and "n_layer" not in info:
        return None
    try:
        n_all = int(info.get("n_layer_all", info.get("n_layer", "0")))
        n_layer = int(info.get("n_layer", n_all))

        def arr(name: str) -> list[int]:
            return list(L.ModelInfo(name, info[name]).ints(n_all)) if name in info else [0] * n_all

        head_k = int(info.get("n_embd_head_k", "0"))
        head_v = int(info.get("n_embd_head_v", "0"))
        facts = {
            "n_layer": n_layer,
            "n_layer_all": n_all,
            "n_swa": int(info.get("n_swa", "0")),
            "head_k": head_k,
            "head_v": head_v,
            "head_k_swa": int(info.get("n_embd_head_k_swa", str(head_k))),
            "head_v_swa": int(info.get("n_embd_head_v_swa", str(head_v))),
            "k_gqa": arr("n_embd_k_gqa"),
            "v_gqa": arr("n_embd_v_gqa"),
            "iswa": iswa,
            "kv": kv,
            "reuse": reuse,
            "recurrent": rec,
        }
    except ValueError:
        return None
    return facts


def _state_widths(base: ModelStructure, n_recr: int, recurrent: Sequence[L.RecurrentStateSize]) -> tuple[int, int, str]:
    """``(n_embd_r, n_embd_s, note)`` consistent with llama.cpp's printed R and S sizes."""
    if not recurrent or n_recr == 0:
        return base.state_r, base.state_s, ""
    rs = recurrent[0]
    rows = rs.cells * (1 + rs.n_rs_seq)

    def mib(width: int) -> float:
        return width * 4 * rows * n_recr / MiB

    if abs(mib(base.state_r) - rs.r_mib) <= 0.0051 and abs(mib(base.state_s) - rs.s_mib) <= 0.0051:
        return base.state_r, base.state_s, ""
    per = 4 * rows * n_recr
    r = round(rs.r_mib * MiB / per)
    s = round(rs.s_mib * MiB / per)
    return (
        r,
        s,
        (
            f"recurrent state widths read from llama.cpp's printed sizes ({r} + {s} f32 per row, "
            f"to +-{0.005 * MiB / per:.1f})"
        ),
    )


def structure_from_facts(
    facts: dict[str, Any],
    base: ModelStructure,
    *,
    recurrent: Sequence[L.RecurrentStateSize] = (),
    llama_build: str = "",
) -> ModelStructure:
    """The probed structure (``source="probe"``).

    Args:
        facts: :func:`collect_facts` output.
        base: the analytic structure of the same model (MLA flag, skipped MTP bytes, state
            widths to check against the printed sizes).
        recurrent: the ``llama_memory_recurrent: size = ...`` records of the same dry run.
        llama_build: the llama.cpp build that was probed.

    Raises:
        ValueError: the facts do not describe ``base``'s model (another block count).
    """
    n_all = int(facts["n_layer_all"])
    if n_all != base.n_layer_all:
        raise ValueError(f"probe saw {n_all} blocks, the header says {base.n_layer_all}")
    n_layer = int(facts["n_layer"])
    kv = {int(il): sec for il, _dev, sec in facts["kv"]}
    reuse = {int(il): (int(src), bool(swa)) for il, src, swa in facts["reuse"]}
    rec = {int(il) for il, _dev in facts["recurrent"]}
    iswa = bool(facts["iswa"])
    k_gqa, v_gqa = list(facts["k_gqa"]), list(facts["v_gqa"])
    layers = []
    for il in range(n_all):
        swa = (kv.get(il) == "swa") if il in kv else (reuse[il][1] if il in reuse else False)
        hk = int(facts["head_k_swa"] if swa else facts["head_k"])
        hv = int(facts["head_v_swa"] if swa else facts["head_v"])
        layers.append(
            LayerRole(
                il=il,
                kv=il in kv,
                swa=swa,
                reuse=reuse[il][0] if il in reuse else -1,
                recurrent=il in rec,
                nextn=il >= n_layer,
                k_width=k_gqa[il],
                v_width=v_gqa[il],
                head_k=hk,
                head_v=hv,
            )
        )
    if rec and kv:
        memory = "hybrid-iswa" if iswa else "hybrid"
    elif rec:
        memory = "recurrent"
    elif kv or reuse:
        memory = "iswa" if iswa else "kv"
    else:
        memory = "none"
    n_swa = int(facts["n_swa"]) if iswa else 0
    swa_type = base.swa_type if (iswa and base.swa_type != "none") else ("standard" if iswa else "none")
    state_r, state_s, note = _state_widths(base, len(rec), recurrent)
    return replace(
        base,
        layers=tuple(layers),
        n_layer=n_layer,
        memory=memory,
        n_swa=n_swa,
        swa_type=swa_type,
        state_r=state_r,
        state_s=state_s,
        v_width_max=max(v_gqa, default=0),
        source="probe",
        note=note,
        llama_build=llama_build,
    )
