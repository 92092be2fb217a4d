"""Fit the pageable share of the pinned host-to-device copy rate from public measurements.

``SpeedConstants.pageable_h2d_share`` prices op offload's copies from pageable host memory
(weights of a memory-mapped model, a KV cache kept on the host). This script reads
``benchmarks/h2d_public_rows.json`` (bandwidthTest and NVIDIA's blog program on named GPUs;
fitting data, never a llama.cpp speed row) and prints, per system, pageable / pinned, and the
median over systems.

Rules, fixed before the fit: only PCIe hosts (NVLink-attached hosts, whose pageable memory the GPU
reads directly, are left out); only rows with both rates; the sizes of one system (same source and
GPU) give one ratio, their median.

Usage::

    python benchmarks/h2d_fit.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROWS = Path(__file__).with_name("h2d_public_rows.json")
#: Hosts whose CPU-GPU link is not PCIe (the rows' notes say so).
NOT_PCIE = ("NVLink",)


def system_ratios(rows: list[dict]) -> list[tuple[str, float, int]]:
    """``(system, median pageable / pinned, sizes)`` per PCIe system with both rates."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if not r.get("pageable_h2d_gbs") or not r.get("pinned_h2d_gbs"):
            continue
        if any(word in (r.get("notes") or "") for word in NOT_PCIE):
            continue
        key = f"{r['gpu']} | {r['source'].split(' (')[0][:60]}"
        groups.setdefault(key, []).append(r["pageable_h2d_gbs"] / r["pinned_h2d_gbs"])
    return [(k, statistics.median(v), len(v)) for k, v in sorted(groups.items())]


def main(argv: list[str] | None = None) -> int:
    """Print the ratios and their median; exit 0."""
    del argv
    rows = json.loads(ROWS.read_text())["rows"]
    ratios = system_ratios(rows)
    for key, ratio, n in ratios:
        print(f"{ratio:5.2f}  ({n} size{'s' if n > 1 else ''})  {key}")
    values = [r for _, r, _ in ratios]
    print(
        f"median over {len(values)} PCIe systems: {statistics.median(values):.2f} "
        f"(range {min(values):.2f}-{max(values):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
