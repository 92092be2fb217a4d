"""The measured share of gpt-oss's experts a ubatch uses (``kvtuner.core.speed.weights.GPT_OSS_ROUTED_SHARE``).

A ubatch of ``u`` tokens copies, of a host-resident expert tensor, only the experts its tokens
route to (ggml-backend.cpp ``ggml_backend_sched_compute_splits``). ``benchmarks/routing_public_rows.json``
holds llama.cpp PR #15346's own speed table, the same run copying every expert and copying the
used ones: per ubatch size, time(used) / time(all) = (s * copy + compute) / (copy + compute) is
an upper bound on the share ``s`` of experts the ubatch used. This script prints those ratios
(rounded to two places), the share uniform routing would give, the table kvtuner uses (each
ratio lowered to the least of the later ones: a bound at more tokens holds at fewer), and the
partly readable per-layer dump of the same PR for comparison. Fitting data only: none of it is
an offload validation row.

Usage::

    python benchmarks/routing_fit.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROWS = Path(__file__).with_name("routing_public_rows.json")


def shares(doc: dict) -> tuple[tuple[int, float], ...]:
    """``((ubatch tokens, share), ...)`` by ubatch: each row's time(used) / time(all) rounded to
    0.01, lowered to the least of the later rows' (a bound at more tokens holds at fewer)."""
    ratios = sorted((r["n_ubatch"], round(r["tps_copy_all"] / r["tps_copy_used"], 2)) for r in doc["ratio_rows"])
    return tuple((u, min(s for _, s in ratios[i:])) for i, (u, _) in enumerate(ratios))


def main(argv: list[str] | None = None) -> int:
    """Print the per-ubatch shares; exit 0."""
    del argv
    doc = json.loads(ROWS.read_text())
    print("ubatch  time(used)/time(all)  uniform routing")
    for r in doc["ratio_rows"]:
        ratio = r["tps_copy_all"] / r["tps_copy_used"]
        p = r["n_expert_used"] / r["n_expert"]
        uniform = 1 - (1 - p) ** r["n_ubatch"]
        print(f"{r['n_ubatch']:6d}  {ratio:20.2f}  {uniform:15.2f}   {r['model']}")
    print("table: " + ", ".join(f"({u}, {s:.2f})" for u, s in shares(doc)))
    for d in doc["dumps"]:
        mean = statistics.mean(d["used"]) / d["n_expert"]
        print(
            f"dump: {d['model']}, ubatch {d['n_ubatch']}, {d['prompt']}: layers {d['layers'][0]}-{d['layers'][-1]} "
            f"use {mean:.2f} of the experts on average"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
