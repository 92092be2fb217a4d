"""Fit the share of a host's RAM bandwidth that llama.cpp's CPU decode reaches
(``kvtuner.core.speed.speed_model.HOST_DECODE_BW_SHARE``) on public CPU-only llama-bench rows.

Rows: ``benchmarks/cpu_decode_public_rows.json``: CPU-only token generation (no GPU backend) on
hosts whose RAM type, data rate and channels the page names, from sources that are not in the
offload validation data (``benchmarks/offload_public_rows.json``): these are fitting rows only.

Each row is predicted as ``benchmarks/offload_validation.py`` predicts a row: a zero-weight GGUF of
the model's published shape and quant, a what-if host of that RAM (the memory catalogue's typical
achieved bandwidth) and that many cores of the reference core, no GPU. The row's share is the
smallest (in thousandths, by bisection) at which the prediction is as fast as the measurement: a
what-if host's decode streams its weights and KV at ``share`` x the RAM's achieved bandwidth, so
its time falls as the share grows until the cores bind. The fitted
share is the median over the rows (one share for every memory type; the per-type medians are
printed for information). Left out, and listed with the reason: a row whose decode is bound by its
cores at share 1, not its RAM (it says nothing about the share), a two-socket host and a
mixture-of-experts model (:func:`left_out`), and a row whose model or test the script cannot write.

    python benchmarks/host_decode_fit.py [--rows FILE] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

from kvtuner.core.tune.bisection import smallest_true
from kvtuner.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
ov = load_script("benchmarks/offload_validation.py")

ROWS = ROOT / "benchmarks" / "cpu_decode_public_rows.json"
#: The largest share searched: above the RAM's achieved figure, up to its read benchmark's margin.
MAX_SHARE = 1.5


#: llama-bench's own label for a checkpoint the page does not name, by its parameter count
#: (``params`` column, billions): "llama 7B" with 6.74 B parameters is the LLaMA / Llama 2 7B shape
#: (32 layers of 4096, vocabulary 32000; Mistral 7B, also labelled "llama 7B", has 7.24 B).
LLAMA_BENCH_LABELS = ((r"llama 7b", 6.74, "Llama-2-7B"),)


def left_out(row: dict) -> str | None:
    """Why a row cannot fit the share, or None: a host of two sockets (the what-if host has one
    memory domain; llama.cpp's threads read across the sockets' link, ggml-cpu.c ``ggml_numa_init``)
    or a model that is a mixture of experts (its bytes per token depend on the routing)."""
    if re.search(r"\b(2x|dual[- ]socket)", f"{row.get('host_cpu')} {row.get('host_ram')}", re.I):
        return "two sockets"
    if re.search(r"mixtral|-a\d+b|moe", str(row.get("model")), re.I):
        return "a mixture of experts"
    return None


def as_offload_row(row: dict) -> dict:
    """The row in the offload data's fields (what :mod:`offload_validation`'s helpers read)."""
    threads = row.get("threads") or row.get("host_cores")
    model = row["model"]
    for label, params_b, name in LLAMA_BENCH_LABELS:
        if re.match(label, model, re.I) and row.get("n_params_b") == params_b:
            model = name
    return {
        **row,
        "model": model,
        "host_ram": f"{row['ram_type']}-{row['ram_mt_s']}",
        "host_ram_channels": row.get("ram_channels"),
        "host_threads": threads,
        "ngl": 0,
        "nkvo": False,
        "flash_attn": row.get("flash_attn"),
        "test": row.get("test") or "tg128",
    }


def implied_share(row: dict, directory: Path) -> dict:
    """``row`` with ``share`` (or ``skip``), ``pred_at_1`` (tokens/s at share 1) and ``host``."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.speed_model import speed_inputs

    rec = dict(row)
    r = as_offload_row(row)
    why = left_out(row)
    if why:
        rec["skip"] = why
        return rec
    try:
        phase, n, depth = ov.test_of(r)
        if phase != "decode":
            raise ValueError(f"{r['test']} is not a decode test")
        path, note, assumed = ov.write_fixture(r, directory)
        if path is None:
            raise ValueError(note)
        h, assumed_h = ov.host_of(r)
        host = ov.host_spec(h)
        plan = plan_memory(ModelProfile.from_gguf(path), ov.config_of(r, phase, n, depth), [], host)

        def seconds(share: float) -> float:
            inputs = speed_inputs([], host, n_threads=h["cores"], measure=False, decode_bw_share=share)
            return 1.0 / ov.predict(plan, inputs, phase, n, depth)

        t1 = seconds(1.0)
        t_meas = 1.0 / float(row["tps"])
        rec.update(pred_at_1=1.0 / t1, host=h["name"], assumed=assumed + assumed_h)
        if t1 <= seconds(MAX_SHARE) * (1 + 1e-9):
            rec["skip"] = "decode bound by the cores, not the RAM"
            return rec
        # the prediction's time falls as the share grows: the smallest share (in thousandths) that
        # is at least as fast as the measurement
        k = smallest_true(lambda k: seconds(k / 1000) <= t_meas, 50, round(MAX_SHARE * 1000))
        if k is None:
            rec["skip"] = f"measured faster than a share of {MAX_SHARE:g} allows"
        else:
            rec["share"] = k / 1000
    except Exception as exc:
        rec["skip"] = f"{type(exc).__name__}: {exc}"
    return rec


def fit(rows: list[dict], directory: Path) -> tuple[float | None, list[dict]]:
    """(the median implied share, or None when no row gives one; every row with :func:`implied_share`'s fields)."""
    recs = [implied_share(r, directory) for r in rows]
    used = [r["share"] for r in recs if "share" in r]
    return (statistics.median(used) if used else None), recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=ROWS)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rows = json.loads(args.rows.read_text())["rows"]
    with tempfile.TemporaryDirectory() as d:
        share, recs = fit(rows, Path(d))
    used = [r for r in recs if "share" in r]
    bar = "|" if args.markdown else " "
    if args.markdown:
        print("| row | CPU | host (as predicted) | model | test | measured | predicted at share 1 | implied share |")
        print("|---|---|---|---|---|---:|---:|---:|")
    for r in recs:
        implied = f"{r['share']:.3f}" if "share" in r else f"left out: {r['skip']}"
        pred = f"{r['pred_at_1']:.2f}" if "pred_at_1" in r else "-"
        cells = [r["id"], r.get("host_cpu", ""), r.get("host", "-"), f"{r['model']} {r.get('quant') or ''}"]
        cells += [r.get("test") or "tg128", f"{float(r['tps']):g}", pred, implied]
        print((f"{bar} " + f" {bar} ".join(cells) + f" {bar}") if args.markdown else "  ".join(cells))
    if share is None:
        print("no row gives a share")
        return 1
    by_type: dict[str, list[float]] = {}
    for r in used:
        by_type.setdefault(r["ram_type"], []).append(r["share"])
    hosts = {r.get("host_cpu") for r in used}
    print()
    print(f"fitted share: median {share:.3f} over {len(used)} rows, {len(hosts)} hosts")
    for t, xs in sorted(by_type.items()):
        print(f"  {t}: median {statistics.median(xs):.3f} over {len(xs)} rows (for information)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
