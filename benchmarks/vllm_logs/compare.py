"""kvtuner's vLLM planning against public vLLM start-up logs (benchmarks/vllm_logs/rows.json).

Two checks per row, printed as ratios ``predicted / logged``:

1. **Pool arithmetic** (kvtuner/core/plan/vllm.py ``pool_from_available``): from the KV budget
   the log states ("kv_cache_size" / "the rest of the memory reserved for KV Cache" /
   "Available KV cache memory"), the number of blocks, the KV tokens and the maximum
   concurrency. A row that logs blocks but no budget checks only the concurrency from the blocks.
2. **Full prediction** (``plan_vllm``): from the card's memory as PyTorch reports it and the
   model's config.json alone: weights, activation peak and non-torch memory estimated by
   kvtuner, each logged component shown beside ours. A row's ``settings.memory_profiling``
   ``mem_get_info`` (vLLM v0.3.x) plans the weights and activation as PyTorch's reserved
   segments. Multimodal rows get no blocks: the planner says "vision encoder not modelled:
   blocks unknown" (their logged activation is shown; they are kept out of the summary). The exporter's text
   (``kvtuner export --format vllm``, kvtuner/core/export/vllm.py ``render``) is parsed too and
   must print the same blocks.

    python benchmarks/vllm_logs/compare.py            # table + summary
    python benchmarks/vllm_logs/compare.py --json     # the same figures as JSON
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from kvtuner.core.export.vllm import render
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.vllm import VllmModel, VllmSettings, plan_vllm, pool_from_available
from kvtuner.core.units import GiB

ROWS = Path(__file__).with_name("rows.json")


def _gib(x: float | None) -> int | None:
    return None if x is None else int(round(x * GiB))


def evaluate(doc: dict) -> list[dict]:
    """One result dict per row: the logged figures, ours, and the ratios."""
    out = []
    for row in doc["rows"]:
        cfg = doc["models"][row["model"]]
        model = VllmModel.from_hf_config(cfg, name=row["model"])
        s = row["settings"]
        settings = VllmSettings(engine=row["engine"], enable_prefix_caching=False, **s)
        lg = row["logged"]
        res: dict = {
            "id": row["id"],
            "card": row["card"],
            "model": row["model"],
            "vllm": row["vllm"],
            "source": row["source"],
            "multimodal": bool(row.get("multimodal")),
        }
        # 1. pool arithmetic from the logged budget
        if "kv_cache_gib" in lg:
            _, blocks, tokens, conc = pool_from_available(model, settings, _gib(lg["kv_cache_gib"]))
            res["arith"] = {"blocks": blocks, "kv_tokens": tokens, "max_concurrency": round(conc, 3)}
            if "gpu_blocks" in lg:
                res.setdefault("arith_ratios", {})["blocks"] = blocks / lg["gpu_blocks"]
            if "kv_tokens" in lg:
                res.setdefault("arith_ratios", {})["kv_tokens"] = tokens / lg["kv_tokens"]
            if "max_concurrency" in lg:
                res.setdefault("arith_ratios", {})["max_concurrency"] = conc / lg["max_concurrency"]
        elif "gpu_blocks" in lg and "max_concurrency" in lg:
            conc = lg["gpu_blocks"] * settings.block_size / settings.max_model_len
            res["arith"] = {"max_concurrency_from_logged_blocks": round(conc, 3)}
            res["arith_ratios"] = {"max_concurrency": conc / lg["max_concurrency"]}
        # 2. full prediction from the card and config.json
        total = lg.get("total_gpu_gib", row.get("total_gpu_gib_assumed"))
        if total is not None:
            weights = _gib(row.get("weights_gib_assumed"))
            plan = plan_vllm(model, settings, _gib(total), weights_bytes=weights, gpu_name=row["card"])
            logged_act = lg.get("activation_gib")
            if logged_act is None and "peak_torch_gib" in lg:
                logged_act = round(lg["peak_torch_gib"] - lg["weights_gib"], 3)
            res["full"] = {
                "total_gib": total,
                "weights_gib": round(plan.weights_bytes / GiB, 3),
                "weights_logged_gib": lg.get("weights_gib"),
                "activation_gib": round(plan.activation_bytes / GiB, 3),
                "activation_logged_gib": logged_act,
                "non_torch_gib": round(plan.non_torch_bytes / GiB, 3),
                "non_torch_logged_gib": lg.get("non_torch_gib"),
                "kv_gib": None if plan.available_kv_bytes is None else round(plan.available_kv_bytes / GiB, 3),
                "kv_logged_gib": lg.get("kv_cache_gib"),
                "blocks": plan.num_blocks,
                "kv_tokens": plan.kv_tokens,
                "max_concurrency": None if plan.max_concurrency is None else round(plan.max_concurrency, 3),
                "batched_tokens": plan.batched_tokens,
            }
            r: dict = {}
            if plan.unknown:  # a multimodal model: no blocks predicted, no ratios
                res["full"]["unknown"] = plan.unknown
            else:
                if "kv_cache_gib" in lg:
                    r["kv_bytes"] = plan.available_kv_bytes / _gib(lg["kv_cache_gib"])
                if "gpu_blocks" in lg:
                    r["blocks"] = plan.num_blocks / lg["gpu_blocks"]
                if "kv_tokens" in lg:
                    r["kv_tokens"] = plan.kv_tokens / lg["kv_tokens"]
                if "max_concurrency" in lg:
                    r["max_concurrency"] = plan.max_concurrency / lg["max_concurrency"]
            res["full_ratios"] = r
            # the same prediction as `kvtuner export --format vllm` prints it
            text = render(row["model"], model, PlanConfig(), settings, _gib(total), weights, row["card"]).text
            blocks_line = next(x for x in text.splitlines() if "# GPU blocks:" in x)
            shown = blocks_line.split("# GPU blocks:", 1)[1].split()[0]
            res["export_blocks"] = None if shown == "unknown" else int(shown)
            if "gpu_blocks" in lg and res["export_blocks"] is not None:
                res["export_ratios"] = {"blocks": res["export_blocks"] / lg["gpu_blocks"]}
        out.append(res)
    return out


def _fmt(r: dict | None) -> str:
    if not r:
        return "-"
    return " ".join(f"{k}={v:.3f}" for k, v in r.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = evaluate(json.loads(ROWS.read_text()))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'row':<26} {'card':<12} {'pool arithmetic (ours/logged)':<48} full prediction (ours/logged)")
    for r in results:
        card = r["card"] if len(r["card"]) <= 12 else r["card"][:11] + "…"
        full = _fmt(r.get("full_ratios")) if r.get("full_ratios") else "-"
        if r.get("full", {}).get("unknown"):
            full = "blocks unknown (vision encoder not modelled)"
        if r["multimodal"]:
            full += "  [multimodal: not in summary]"
        print(f"{r['id']:<26} {card:<12} {_fmt(r.get('arith_ratios')):<48} {full}")
        f = r.get("full")
        if f:
            print(
                f"{'':<26} components GiB ours (logged): weights {f['weights_gib']} ({f['weights_logged_gib']}), "
                f"activation {'unknown' if f.get('unknown') else f['activation_gib']} ({f['activation_logged_gib']}) at {f['batched_tokens']} tokens, "
                f"non-torch {f['non_torch_gib']} ({f['non_torch_logged_gib']}), KV {'unknown' if f['kv_gib'] is None else f['kv_gib']} ({f['kv_logged_gib']})"
            )
    arith = [abs(v - 1) for r in results for v in r.get("arith_ratios", {}).values()]
    full = [abs(v - 1) for r in results if not r["multimodal"] for v in r.get("full_ratios", {}).values()]
    pairs = {(r["model"], r["card"]) for r in results if r.get("arith_ratios") or r.get("full_ratios")}
    print()
    same = all(r["export_blocks"] == r["full"]["blocks"] for r in results if "full" in r)
    print(f"kvtuner export --format vllm prints the same blocks as the full prediction on every row: {same}")
    print(f"model/card pairs checked: {len(pairs)}; rows: {len(results)}")
    if arith:
        print(
            f"pool arithmetic: {len(arith)} figures, max |error| {max(arith):.2%}, median {statistics.median(arith):.2%}"
        )
    if full:
        print(
            f"full prediction (text models): {len(full)} figures, max |error| {max(full):.2%}, median {statistics.median(full):.2%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
