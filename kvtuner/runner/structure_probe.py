"""The structure probe: a model's per-layer memory structure as the installed llama.cpp builds it.

A dry run (no_alloc load + context) logs, besides its sizes, one DEBUG line per layer that gets
a K/V entry (``llama_kv_cache: layer %3d: dev = %s``, llama-kv-cache.cpp constructor), one per
layer reading another's KV (``- layer %3d: reuse layer %d, is_swa = %d``), the iSWA split
(``llama_kv_cache_iswa: creating non-SWA / SWA KV cache``, llama-kv-cache-iswa.cpp), one per
recurrent layer (``llama_memory_recurrent, layer %3d: dev = %s``, llama-memory-recurrent.cpp),
and ``print_info`` lines with the per-layer K/V widths, head sizes, ``n_layer`` (trunk) and
``n_swa`` (llama-model.cpp ``print_info``). :func:`collect_facts` (in the runner's child) keeps
those facts as a JSON-able dict; :func:`kvtuner.core.model.probed_structure.structure_from_facts`
(in the parent) turns them into a :class:`~kvtuner.core.model.structure.ModelStructure` with
``source="probe"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.model.structure import differences  # noqa: F401 (re-exported)
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
