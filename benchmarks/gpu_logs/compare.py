"""Plan every row of the public-log truth set with kvtuner and print planned vs logged buffers.

Each row of ``rows.json`` is a llama.cpp CUDA run whose buffer lines were pasted in a public
issue or published by ggml-org's CI. For every plannable row this script writes a sparse GGUF
with the printed shapes (``kvtuner/testing/gguf_factory.py``), runs ``python -m kvtuner.cli plan ... --json``
with the row's settings and a what-if GPU of the printed free memory, and compares per buffer:

    model   weights per device (CUDAn; host = CPU/CPU_Mapped/CUDA_Host/CPU_AARCH64 summed)
    kv      KV cache per device
    compute compute buffer per GPU, and the pinned host compute buffer (CUDA_Host)
    output  the logits buffer (host)

Rules differ between builds (``rows.json`` ``ngl_rules``); kvtuner follows post-#18148 (output
layer offloaded first). A pre-#18148 row with ``0 < -ngl N <= n_layer`` is planned with ``--ngl N+1``
(the same N repeating layers on the GPU) and the output layer's weights are moved back to the host
in the comparison; its compute buffers are shown but left out of the medians (the output layer
runs on another device than kvtuner plans). ``-ngl 0`` places nothing on the GPU under both rules.
Buffers excluded from the medians say why.

A not-plannable row with a ``partial_check`` (tensor overrides: ``-ot``, ``--n-cpu-moe``) is still
planned without the overrides, and only the buffer kinds it names (KV per device, output: llama.cpp
assigns layers and their KV to devices by ``-ngl`` and the free-memory split, whatever the overrides
move) are compared; the rest are shown as ``n/c``.

Usage::

    PYTHONPATH=. python benchmarks/gpu_logs/compare.py [--rows ID ...] [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

MiB = 1 << 20
HOST_DEVICES = {"CPU", "CPU_Mapped", "CUDA_Host", "CPU_AARCH64", "CPU_REPACK"}
KINDS = ["model_gpu", "model_host", "kv_gpu", "kv_host", "compute_gpu", "compute_host", "output"]


def load_rows(path: Path = HERE / "rows.json") -> dict:
    """The truth set (``schema``, ``rows`` ...)."""
    return json.loads(path.read_text())


def spec_from_fixture(fx: dict):
    """A gguf_factory.ModelSpec from a row's ``fixture`` (type names as strings)."""
    import gguf

    from kvtuner.testing.gguf_factory import ModelSpec

    q = gguf.GGMLQuantizationType
    kw = dict(fx)
    kw["weight_type"] = q[kw.get("weight_type", "F16")]
    for key in ("tensor_types", "more_bits_types"):
        kw[key] = {k: q[v] for k, v in kw.get(key, {}).items()}
    if kw.get("file_type"):
        kw["file_type"] = int(gguf.LlamaFileType[kw["file_type"]])
    return ModelSpec(**kw)


def output_layer_bytes(spec) -> int:
    """Bytes of the output layer as llama.cpp places it (output.weight or the tied copy, output_norm*)."""
    from kvtuner.testing.gguf_factory import tensor_bytes

    tb = tensor_bytes(spec)
    out = sum(v for k, v in tb.items() if k.startswith("output"))
    if spec.tied_output:
        out += tb["token_embd.weight"]
    return out


def plan_args(row: dict, spec) -> tuple[list[str], dict]:
    """kvtuner CLI flags for ``row`` and how the row's rule was mapped onto kvtuner's."""
    s = row["settings"]
    n_layer = spec.n_layer
    args = ["--ctx", str(s["n_ctx"])]
    adapt = {"output_moved_to_host": False, "compute_comparable": True}
    ngl = s["n_gpu_layers"]
    if ngl is None or ngl > n_layer:
        args += ["--ngl", "all"]
    elif ngl == 0:
        # no layer on the GPU: the same placement under both rules
        args += ["--ngl", "0"]
    elif row["ngl_rule"] == "pre-#18148":
        # old rule: N repeating layers, output on the CPU -> kvtuner --ngl N+1 puts the same N repeating
        # layers on the GPU plus the output layer; move the output layer back in the comparison
        args += ["--ngl", str(ngl + 1)]
        adapt.update(output_moved_to_host=True, compute_comparable=False)
    else:
        args += ["--ngl", str(ngl)]
    if s.get("no_kv_offload"):
        args += ["--kv-gpu-layers", "0"]
    args += ["-fa", "on" if s.get("flash_attn") else "off"]
    args += ["-ctk", s.get("type_k") or "f16", "-ctv", s.get("type_v") or "f16"]
    if s.get("n_seq", 1) > 1:
        args += ["-np", str(s["n_seq"])]
    if s.get("n_ubatch"):
        args += ["-ub", str(s["n_ubatch"])]
    if s.get("n_batch"):
        args += ["-b", str(s["n_batch"])]
    if not s.get("mmap", True):
        args += ["--no-mmap"]
    for g in _gpu_sizes(row):
        args += ["--gpu-mem", g]
    return args, adapt


def _gpu_sizes(row: dict) -> list[str]:
    """What-if GPU sizes: printed free memory, else the card's total; -ts gives equal cards."""
    gpus = row["gpus"]
    ts = row["settings"].get("tensor_split")
    sizes = []
    for g in gpus:
        mib = g.get("free_mib") or g.get("total_mib") or 24576
        sizes.append(mib)
    if ts and len(ts) == len(sizes):
        # llama.cpp splits layers by -ts proportions: give kvtuner cards in those proportions
        base = max(sizes)
        sizes = [int(base * t / max(ts)) for t in ts]
    return [f"{m}M" for m in sizes]


def run_plan(model: Path, args: list[str]) -> dict:
    """``python -m kvtuner.cli plan MODEL ARGS --json`` in a child process (the CLI is the interface)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "kvtuner.cli", "plan", str(model), *args, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"kvtuner plan failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.strip()}")
    return json.loads(p.stdout)


def logged_buffers(row: dict) -> dict[tuple[str, str], float]:
    """(kind, device) -> MiB from the row's buffer lines; host devices are summed as 'host'."""
    out: dict[tuple[str, str], float] = {}
    for b in row["buffers"]:
        dev = "host" if b["device"] in HOST_DEVICES else b["device"]
        key = (b["kind"], dev)
        out[key] = out.get(key, 0.0) + b["mib"]
    return out


def planned_buffers(plan: dict, adapt: dict, out_bytes: int) -> dict[tuple[str, str], float]:
    """(kind, device) -> MiB from kvtuner's plan JSON, after the rule adaptation."""
    res: dict[tuple[str, str], float] = {}
    for d in plan["devices"]:
        dev = "host" if d["kind"] == "host" else d["device"]
        res[("model", dev)] = d["weights_bytes"] / MiB
        res[("kv", dev)] = d["kv_bytes"] / MiB
        res[("compute", dev)] = d["compute_bytes"] / MiB
        if dev == "host":
            res[("output", dev)] = d["output_bytes"] / MiB
    if adapt["output_moved_to_host"]:
        for d in plan["devices"]:
            if d["kind"] == "gpu" and d["has_output"]:
                res[("model", d["device"])] -= out_bytes / MiB
                res[("model", "host")] += out_bytes / MiB
    return res


def kind_of(kind: str, dev: str) -> str:
    """Median bucket of a buffer."""
    if kind == "output":
        return "output"
    return f"{kind}_{'host' if dev == 'host' else 'gpu'}"


def compare_row(row: dict, workdir: Path) -> dict:
    """Plan one row; returns its per-buffer comparison (or why it was not planned)."""
    res = {
        "id": row["id"],
        "split": row["split"],
        "build_group": row["build_group"],
        "ngl_rule": row["ngl_rule"],
        "build": row["build"].get("number"),
    }
    partial = row.get("partial_check")
    if not row.get("plannable") and not partial:
        res["status"] = "not plannable yet"
        res["reason"] = row.get("not_plannable_reason", "")
        return res
    from kvtuner.testing.gguf_factory import tensor_bytes, write_model

    spec = spec_from_fixture(row["fixture"])
    model = workdir / f"{row['id']}.gguf"
    if not model.exists():
        write_model(model, spec)
    args, adapt = plan_args(row, spec)
    plan = run_plan(model, args)
    planned = planned_buffers(plan, adapt, output_layer_bytes(spec))
    logged = logged_buffers(row)
    mmap = row["settings"].get("mmap", True)
    full = plan["effective"]["n_gpu_repeating"] == spec.n_layer
    buffers = []
    for (kind, dev), mib in sorted(logged.items()):
        p = planned.get((kind, dev), 0.0)
        excluded = None
        if partial and kind not in partial["kinds"]:
            kinds = "/".join(partial["kinds"])
            excluded = f"not plannable yet (see not_plannable_reason); partial check of {kinds} only"
        elif kind == "compute" and not adapt["compute_comparable"]:
            excluded = "output layer on another device than kvtuner plans (pre-#18148 -ngl rule)"
        elif kind == "model" and dev == "host" and mmap and not full:
            excluded = "host weights of a partial offload: mmap span (+ CPU_AARCH64 repack), not a byte count"
        # the log prints 2 decimals: a difference inside that rounding is no error
        err = 0.0 if abs(p - mib) <= 0.005 else ((p - mib) / mib if mib else None)
        buffers.append(
            {
                "kind": kind,
                "device": dev,
                "bucket": kind_of(kind, dev),
                "logged_mib": round(mib, 2),
                "planned_mib": round(p, 2),
                "rel_err": None if err is None else round(err, 4),
                "excluded": excluded,
            }
        )
    res.update(
        status="partial" if partial else "planned",
        kvtuner_args=args,
        adapt=adapt,
        buffers=buffers,
        fixture_weights_mib=round(sum(tensor_bytes(spec).values()) / MiB, 2),
        warnings=plan.get("warnings", []),
    )
    return res


def medians(results: list[dict]) -> dict:
    """Median |relative error| per bucket, per split and per (split, build group); n per cell."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    for r in results:
        for b in r.get("buffers", []):
            if b["excluded"] or b["rel_err"] is None:
                continue
            for group in ("all", r["build_group"]):
                cells.setdefault((r["split"], group, b["bucket"]), []).append(b["rel_err"])
    out: dict = {}
    for (split, group, bucket), errs in sorted(cells.items()):
        out.setdefault(split, {}).setdefault(group, {})[bucket] = {
            "median_abs_rel_err": round(statistics.median(abs(e) for e in errs), 4),
            "median_signed_rel_err": round(statistics.median(errs), 4),
            "n": len(errs),
        }
    return out


def render(results: list[dict], med: dict) -> str:
    """The text report: one line per buffer, then the medians."""
    lines = []
    hdr = f"{'row':44} {'split':9} {'build':>5} {'buffer':15} {'logged':>9} {'planned':>9} {'err':>8}  note"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for r in results:
        if r["status"] == "not plannable yet":
            lines.append(f"{r['id']:44} {r['split']:9} {r['build'] or '?'!s:>5} NOT PLANNABLE YET: {r['reason']}")
            continue
        for b in r["buffers"]:
            err = "" if b["rel_err"] is None else f"{b['rel_err'] * 100:+.1f}%"
            note = f"n/c: {b['excluded']}" if b["excluded"] else ""
            lines.append(
                f"{r['id']:44} {r['split']:9} {r['build'] or '?'!s:>5} {b['kind'] + ' ' + b['device']:15} "
                f"{b['logged_mib']:9.2f} {b['planned_mib']:9.2f} {err:>8}  {note}"
            )
    lines.append("")
    lines.append(
        "median |relative error| (signed median, n) per buffer kind; n/c buffers left out"
        " (not_plannable: the parts partial checks compare)"
    )
    for split in ("fit", "held_out", "not_plannable"):
        for group, buckets in med.get(split, {}).items():
            cells = ", ".join(
                f"{k} {v['median_abs_rel_err'] * 100:.1f}% ({v['median_signed_rel_err'] * 100:+.1f}%, n={v['n']})"
                for k, v in sorted(buckets.items(), key=lambda kv: KINDS.index(kv[0]))
            )
            lines.append(f"  {split:9} {group}: {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", default=None, metavar="ID", help="only these row ids")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--keep", default=None, metavar="DIR", help="write the sparse fixtures here (default: a temp dir)")
    a = ap.parse_args(argv)
    doc = load_rows()
    rows = [r for r in doc["rows"] if a.rows is None or r["id"] in a.rows]
    if a.rows is not None and len(rows) != len(a.rows):
        missing = set(a.rows) - {r["id"] for r in rows}
        ap.error(f"unknown row id(s): {', '.join(sorted(missing))}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.keep) if a.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = [compare_row(r, work) for r in rows]
    med = medians(results)
    if a.json:
        json.dump({"results": results, "medians": med}, sys.stdout, indent=1)
        print()
    else:
        print(render(results, med))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
