"""Decode rates of llama.cpp's table-lookup weight types on this machine's CPU, against MXFP4.

Runs kvtuner's CPU probe (``kvtuner.runner.probe.run_cpu_probe``: zero-weight probe models
through llama.cpp itself) at ``--threads`` threads for MXFP4, Q4_K and every type of
``kvtuner.core.speed.cpu_probe.LOOKUP_TYPES``, and prints each type's decode bytes/s and its ratio
to MXFP4's. MXFP4 is the slowest streaming type of the reference core
(``speed_model.REFERENCE_CORE_DECODE_BYTES_S``); the ratios are the per-type factors a host without
a probe of its own uses (``speed_model.LOOKUP_TYPE_DECODE_FACTOR``, each capped at 1).

These are kernel measurements on probe models only: no row of any validation set is used.

    python benchmarks/lookup_type_rates.py [--threads N] [--markdown]
"""

from __future__ import annotations

import argparse
import platform
import sys
from datetime import UTC, datetime

from kvtuner.core.speed.cpu_probe import LOOKUP_TYPES
from kvtuner.runner.probe import run_cpu_probe

ANCHOR = "MXFP4"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (-t) for the probe (default 1)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    types = [ANCHOR, "Q4_K", *sorted(LOOKUP_TYPES)]
    rates = run_cpu_probe(types, args.threads, attn_shapes=(), repetitions=3)
    if rates.busy:
        print(
            f"the machine was busy ({rates.other_cores:.1f} cores of other load): run again when idle", file=sys.stderr
        )
        return 1
    dec = rates.decode_bytes_s
    anchor = dec[ANCHOR]
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {platform.processor() or platform.machine()}, "
        f"{args.threads} thread(s), other load {rates.other_cores:.2f} cores"
    )
    if args.markdown:
        print("| type | decode GB/s | / MXFP4 |\n|---|---:|---:|")
    for t in types:
        if t not in dec:
            print(f"{t}: not measured", file=sys.stderr)
            continue
        line = (
            f"| {t} | {dec[t] / 1e9:.2f} | {dec[t] / anchor:.3f} |"
            if args.markdown
            else f"{t:8s} {dec[t] / 1e9:6.2f} GB/s  {dec[t] / anchor:.3f} x MXFP4"
        )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
