"""A model's per-layer structure as the installed llama.cpp built it (``source="probe"``).

A dry run logs one DEBUG line per layer that gets a K/V entry, one per layer reading another's
KV, the iSWA split, one per recurrent layer and ``print_info`` lines with the per-layer K/V
widths (the runner's structure probe, :mod:`kvtuner.runner.structure_probe`, collects them as
:attr:`~kvtuner.core.llama_report.DryRunResult.structure_facts`); :func:`structure_from_facts`
turns those facts into a :class:`~kvtuner.core.model.structure.ModelStructure`.

The recurrent state width per row (``n_embd_r``, ``n_embd_s``) is not printed per layer: the
probe takes the analytic widths when they reproduce llama.cpp's printed R and S sizes (to the
0.005 MiB of the print), else the widths the printed sizes imply (rounded, and noted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..llama_report import DryRunResult, RecurrentStateReport
from ..units import MiB
from .structure import LayerRole, ModelStructure


def report_structure(result: DryRunResult, base: ModelStructure) -> ModelStructure | None:
    """The model's structure as llama.cpp built it in the dry run ``result``, from its facts and
    ``base`` (the header's analytic structure); None when the log had no facts or they do not
    fit the model."""
    if not result.structure_facts:
        return None
    try:
        return structure_from_facts(
            result.structure_facts, base, recurrent=result.recurrent, llama_build=result.llama_build
        )
    except (ValueError, KeyError, TypeError):
        return None


def _state_widths(base: ModelStructure, n_recr: int, recurrent: Sequence[RecurrentStateReport]) -> tuple[int, int, str]:
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
    recurrent: Sequence[RecurrentStateReport] = (),
    llama_build: str = "",
) -> ModelStructure:
    """The probed structure (``source="probe"``).

    Args:
        facts: the runner's ``kvtuner.runner.structure_probe.collect_facts`` output
            (:attr:`~kvtuner.core.llama_report.DryRunResult.structure_facts`).
        base: the analytic structure of the same model (MLA flag, skipped MTP bytes, state
            widths to check against the printed sizes).
        recurrent: the recurrent state records of the same dry run.
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
