"""CPU speed of MoE models: the expert-matmul efficiency of a host prefill, fitted on one
row and checked on rows nobody fitted to.

On a CPU-only run every expert is on the host, so these runs are "experts on the CPU" at their
purest: a token reads n_expert_used / n_expert of each layer's experts and the CPU computes them.
The measurements are real runs of zero-weight sparse GGUF files of real MoE shapes through
kvtuner's runner (``kvtuner bench -p 128 -n 32 -r 1 -d D``, -t 1, cold: the CPU probe, no
calibration), like benchmarks/speed_validation.py, whose stored runs this reuses:

    fitting set     granite-3.0-1b-a400m Q4_K_M, depth 0 (SpeedConstants.host_moe_prefill_efficiency)
    validation set  granite-3.0-1b-a400m Q4_K_M depth 2048 (same model, other depth: a weaker check),
                    olmoe-1b-7b Q4_K_M and qwen1.5-moe-a2.7b Q4_K_M at depths 0 and 2048
                    (benchmarks/speed_cpu_runs.json, measured before this constant existed), and
                    the rows of benchmarks/moe_cpu_runs.json measured here with --measure:
                    Qwen3-30B-A3B's per-layer shapes (qwen3moe, 128 experts / 8 used) with 8 of its
                    48 layers (the full model does not fit beside three other jobs in 24 GiB),
                    gpt-oss-20b's (MXFP4 experts as the published file ships them, 32 experts /
                    4 used, router bias) with 6 of its 24 layers, and DeepSeek-V2-Lite's
                    (deepseek2: MLA, a dense first layer, 64 experts / 6 used plus 2 shared,
                    llama-quantize's Q4_K_M types) with 6 of its 27 layers; each benched between
                    two runs of the fitting row (the "anchor"), so that a measurement taken while
                    other jobs load the machine can be read against the slowdown they caused (its
                    quiet-machine speed is stored)

Every extra file carries routing data (random token embeddings and routers, unit norms; see
kvtuner/testing/gguf_factory.py above ``RealShape``), so each token picks its own experts as in a real model:
``--check-routing`` shows it, from the routers in the file and by timing a prefill with and without
that data. Their MXFP4 blocks carry a normal scale (``write_mxfp4_scales``: a zero exponent byte is
a subnormal float, and the MXFP4 kernels ran 2.7x slower on it). Errors are ``predicted / measured
- 1``. The predictions are kvtuner's: the stored probe plus this CPU's probe of the types and
shapes it lacks (MXFP4, the 64/8/64 and 32/4/128 attention; ``--measure`` probes them once and
stores them as ``probe_gaps``), as ``kvtuner`` probes a model's own types and shapes before
predicting it; a second table shows the extra rows with the stored probe alone, its nearest type
or shape standing in.

    python benchmarks/moe_cpu_validation.py --fit            # fit the efficiency on the fitting row
    python benchmarks/moe_cpu_validation.py                  # print every row (prediction vs measurement)
    python benchmarks/moe_cpu_validation.py --measure        # bench the extra rows (minutes, 1 thread)
    python benchmarks/moe_cpu_validation.py --check-routing  # experts picked, prefill with / without routing data
    python benchmarks/moe_cpu_validation.py --measure-here   # probe + bench every row on this CPU (~25 min)

``--measure-here`` checks everything on the machine it runs on, nothing fitted there: one CPU probe
of every type, attention shape (DeepSeek-V2-Lite's MLA too: cpu_probe ``attention_model`` of
16/1/576/512, a deepseek2 probe with its latent cache) and MoE expert shape (cpu_probe
``expert_model``: the decode of ggml's MUL_MAT_ID at the model's own expert shape and types), then a
bench of every row, granite's too (median of 3; stored as ``here``; to measure afresh, move
``here`` into the list ``here_earlier``, whose records are printed too: the AMD EPYC with AVX2 only
of 2026-12-01 12:33, measured before the MLA attention probe existed). ``host_moe_prefill_efficiency`` keeps the value fitted on granite on the
machine of the stored probe, so on another machine every row is a validation row.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import speed_validation as SV

STORED = ROOT / "benchmarks" / "speed_cpu_runs.json"
EXTRA = ROOT / "benchmarks" / "moe_cpu_runs.json"
FIT_ROW = ("granite-3.0-1b-a400m", "Q4_K_M", 0)
MOE_KEYS = ("granite-3.0-1b-a400m", "olmoe-1b-7b", "qwen1.5-moe-a2.7b")
#: the extra shapes: (key, real shape, layers kept, file type)
EXTRA_SHAPES = [
    ("qwen3-30b-a3b-8l", "qwen3-30b-a3b", 8, "Q4_K_M"),
    ("gpt-oss-20b-6l", "gpt-oss-20b", 6, "MXFP4_MOE"),
    ("deepseek-v2-lite-6l", "deepseek-v2-lite", 6, "Q4_K_M"),
]
#: Table labels of the extra rows
LABELS = {
    "qwen3-30b-a3b-8l": "Qwen3-30B-A3B shapes, 8 of 48 layers,",
    "gpt-oss-20b-6l": "gpt-oss-20b shapes, 6 of 24 layers,",
    "deepseek-v2-lite-6l": "DeepSeek-V2-Lite shapes, 6 of 27 layers,",
}
#: shapes laid out by kvtuner/testing/gguf_families.py (architectures the RealShape writer does not know)
FAMILY_SHAPES = ("gpt-oss-20b", "deepseek-v2-lite")


def family_spec(shape: str, n_layer: int, ftype: str):
    """The :class:`gguf_factory.ModelSpec` of a family shape with ``n_layer`` layers, its tensor types
    those of the published file (gpt-oss-20b) or of llama-quantize's mix (DeepSeek-V2-Lite).

    gpt-oss-20b ``MXFP4_MOE`` (general.file_type 38): as ggml-org/gpt-oss-20b-GGUF ships it, whose
    llama.cpp load log reads "type f32: 289, q8_0: 98, mxfp4: 72 tensors, 11.27 GiB": the 72 expert
    matrices MXFP4, the other 98 matrices (attn_q/k/v/output of 24 layers, token_embd, output) Q8_0,
    and 12 F32 tensors per layer (2 norms, attn_sinks, attn_q/k/v/output biases, the router's weight
    and bias, 3 expert biases) plus output_norm; kvtuner/testing/gguf_families.py ``gpt_oss`` lacks the optional
    attn_q/k/v biases (openai-moe.cpp loads them through ``create_tensor_qkv``), added here.

    DeepSeek-V2-Lite ``Q4_K_M`` (15): llama-quantize's choice in the llama.cpp that llama-cpp-python
    0.3.36 vendors (src/llama-quant.cpp ``llama_tensor_get_type_impl`` / ``tensor_type_fallback``,
    n_expert 64): Q4_K matrices, Q6_K output, ``ffn_down*`` Q6_K in the ``use_more_bits`` layers,
    a k-quant over rows not a multiple of 256 falls back (Q4_K -> Q5_0, Q6_K -> Q8_0: attn_k_b's
    128-wide rows, ffn_down's 10944 and ffn_down_exps' 1408); F32 norms and routers. At a layer count
    other than 26 or 27, llama.cpp's deepseek2 loader (``load_arch_hparams``, ``is_lite``) requires
    ``attention.q_lora_rank``: 0 (no Q LoRA, as Lite has) is written.

    Raises:
        ValueError: a shape or file type this function does not write.
    """
    import dataclasses

    import gguf

    from kvtuner.testing import gguf_families as F
    from kvtuner.testing.gguf_factory import _use_more_bits as use_more_bits

    Q, FT = gguf.GGMLQuantizationType, gguf.LlamaFileType
    if shape == "gpt-oss-20b" and ftype == "MXFP4_MOE":
        s = F.gpt_oss(n_layer=n_layer, name=f"gpt-oss-20b shape, {n_layer} layers (zero weights)")
        width = {n: sh[1] for n, sh, _ in s.tensors if n.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight"))}
        rows = []
        for name, sh, t in s.tensors:
            if name.endswith("_exps.weight"):
                t = Q.MXFP4
            elif t == Q.F16:
                t = Q.Q8_0
            rows.append((name, sh, t))
            if name.endswith("attn_v.weight"):  # after the matrices, the q/k/v biases
                p = name[: -len("attn_v.weight")]
                rows += [(p + f"attn_{x}.bias", (width[p + f"attn_{x}.weight"],), Q.F32) for x in "qkv"]
        return dataclasses.replace(s, tensors=rows, file_type=int(FT.MOSTLY_MXFP4_MOE))
    if shape == "deepseek-v2-lite" and ftype == "Q4_K_M":
        s = F.deepseek2(n_layer=n_layer, name=f"DeepSeek-V2-Lite shape, {n_layer} layers (zero weights)")
        fallback = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}

        def ty(name: str, sh: tuple[int, ...], t: int) -> int:
            if t != Q.F16:
                return t  # F32: norms and routers are not quantized
            il = int(name.split(".")[1]) if name.startswith("blk.") else -1
            if name == "output.weight":
                t = Q.Q6_K
            elif "ffn_down" in name and use_more_bits(il, n_layer):
                t = Q.Q6_K
            else:
                t = Q.Q4_K
            return fallback[t] if sh[0] % 256 else t

        rows = [(n, sh, ty(n, sh, t)) for n, sh, t in s.tensors]
        kv = {**s.extra_kv, "deepseek2.attention.q_lora_rank": 0, "deepseek2.expert_weights_scale": 1.0}
        return dataclasses.replace(s, tensors=rows, extra_kv=kv, file_type=int(FT.MOSTLY_Q4_K_M))
    raise ValueError(f"no family fixture for {shape} {ftype}")


def _real_shape(key: str):
    from kvtuner.testing.compute_cases import EXTRA_SHAPES
    from kvtuner.testing.gguf_factory import REAL_SHAPES

    if key == "qwen3-30b-a3b":
        # the published 48 layers (compute_cases keeps 8 for the reserve graph)
        return replace(EXTRA_SHAPES["qwen3-30b-a3b"], n_layer=48)
    return REAL_SHAPES[key]


def fixture(key: str, ftype: str, directory: Path, *, routing: bool = True) -> Path:
    """The model file of a row (written once into ``directory``): an extra shape's sparse file with
    routing data (``routing=False``: without, all routing tensors zero, for the routing check) and
    MXFP4 blocks with a normal scale (``write_mxfp4_scales``: a zero exponent is a subnormal float
    that slows the MXFP4 kernels 2.7x), else speed_validation's fixture.

    The routing data is ``write_routing_data``'s (embeddings centred on zero) for every extra row:
    ``write_real_shape``'s own all-positive Q4_K embeddings let Qwen3-30B-A3B's tokens reach only
    73-86 of its 128 experts, so its file gets the centred data written over them (``.r2`` in the
    name marks files written this way).
    """
    for k, shape, n_layer, ft in EXTRA_SHAPES:
        if k == key:
            from kvtuner.testing.gguf_factory import (
                write_model,
                write_mxfp4_scales,
                write_real_shape,
                write_routing_data,
            )

            path = directory / f"{key}-{ft}{'' if routing else '-norouting'}.r2.gguf"
            if path.exists():
                return path
            if shape in FAMILY_SHAPES:
                write_model(path, family_spec(shape, n_layer, ft))
            elif routing:
                write_real_shape(path, replace(_real_shape(shape), n_layer=n_layer, key=key), ft)
            else:
                raise ValueError(f"{key}: files without routing data are written for family shapes only")
            if routing:
                write_routing_data(path)
            write_mxfp4_scales(path)
            return path
    return SV.fixture(key, ftype, directory)


def predict(rows: list[dict], probe: dict, directory: Path, efficiency: float | None = None) -> list[dict]:
    from kvtuner.core.hardware.specs import HostSpec
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.speed.cpu_probe import CpuRates
    from kvtuner.core.speed.speed_model import SpeedConstants, decode_tok_s, prefill_tok_s, speed_inputs

    rates = CpuRates.from_dict(probe)
    host = HostSpec(total_bytes=64 << 30, available_bytes=48 << 30, mem_bandwidth_bytes_s=20e9)
    consts = SpeedConstants() if efficiency is None else SpeedConstants(host_moe_prefill_efficiency=efficiency)
    out = []
    for r in rows:
        prof = ModelProfile.from_gguf(fixture(r["key"], r["ftype"], directory))
        plan = plan_memory(prof, SV.cpu_config(r["depth"]), [], host)
        inp = speed_inputs([], host, n_threads=r["threads"], cpu=rates, constants=consts)
        dd = r["depth"] + SV.CPU_PROMPT + (SV.CPU_GEN - 1) // 2
        out.append(
            {
                **r,
                "pred_prefill": prefill_tok_s(plan, inp, SV.CPU_PROMPT, r["depth"]),
                "pred_decode": decode_tok_s(plan, inp, dd),
            }
        )
    return out


def fit(rows: list[dict], probe: dict, directory: Path) -> float:
    """The efficiency that makes the fitting row's prefill prediction equal its measurement (bisection)."""
    (row,) = [r for r in rows if (r["key"], r["ftype"], r["depth"]) == FIT_ROW]
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        p = predict([row], probe, directory, mid)[0]["pred_prefill"]
        lo, hi = (mid, hi) if p < row["prefill_tok_s"] else (lo, mid)
    return (lo + hi) / 2


#: Repetitions of a --measure bench of an extra row (the median is kept; the anchor runs once).
MEASURE_REPETITIONS = 3


def _bench(path: Path, depth: int, threads: int, repetitions: int = 1) -> dict:
    from kvtuner.runner.bench import run_bench

    t0 = time.time()
    r = run_bench(
        path,
        SV.cpu_config(depth),
        n_prompt=SV.CPU_PROMPT,
        n_gen=SV.CPU_GEN,
        n_depth=depth,
        repetitions=repetitions,
        n_threads=threads,
        timeout_s=3600,
        idle_timeout_s=3600,
    )
    return {
        "depth": depth,
        "threads": threads,
        "repetitions": repetitions,
        "prefill_tok_s": r.prefill_tok_s.median,
        "decode_tok_s": r.decode_tok_s.median,
        "wall_s": time.time() - t0,
        "load_avg": os.getloadavg()[0],
        "t_unix": time.time(),
    }


def measure(threads: int, directory: Path, data: dict) -> dict:
    """Bench the extra shapes, each between two runs of the anchor (the fitting row, stored from a
    quiet machine), so a run beside other jobs can be read against the slowdown they caused."""
    data.setdefault("runs", [])
    data.setdefault("anchors", [])
    anchor = SV.fixture(FIT_ROW[0], FIT_ROW[1], directory)
    done = {(r["key"], r["depth"]) for r in data["runs"]}
    for key, _, _, ft in EXTRA_SHAPES:
        for depth in SV.CPU_DEPTHS:
            if (key, depth) in done:
                continue
            before = _bench(anchor, FIT_ROW[2], threads)
            rec = {
                "key": key,
                "ftype": ft,
                "set": "validate",
                **_bench(fixture(key, ft, directory), depth, threads, MEASURE_REPETITIONS),
            }
            after = _bench(anchor, FIT_ROW[2], threads)
            rec["anchor"] = {k: (before[k] + after[k]) / 2 for k in ("prefill_tok_s", "decode_tok_s", "load_avg")}
            data["runs"].append(rec)
            data["anchors"] += [before, after]
            EXTRA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            print(
                f"# measured {key} depth {depth}: {rec['wall_s']:.0f} s, load {rec['load_avg']:.2f}; anchor "
                f"{rec['anchor']['prefill_tok_s']:.1f} / {rec['anchor']['decode_tok_s']:.2f} tok/s",
                flush=True,
            )
    return data


def router_spread(path: Path, n_tokens: int = SV.CPU_PROMPT, seed: int = 1) -> list[tuple[int, int, int]]:
    """Which experts ``n_tokens`` random tokens pick in each MoE layer of a zero-weight file with
    routing data, computed from the file's own tensors: with every other weight zero, attention
    and experts add nothing, so each layer's router sees the token's embedding, RMS-normed (unit
    norms), and picks the top n_expert_used of ``ffn_gate_inp @ x (+ ffn_gate_inp.bias)``
    (llama-graph.cpp ``build_moe_ffn``: the top-k of the logits, or of their softmax, the same
    experts). Returns ``(layer, distinct expert sets, experts hit)`` per MoE layer."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    k = int(reader.fields[f"{arch}.expert_used_count"].parts[-1][0])
    emb = tensors["token_embd.weight"]
    n_embd, n_vocab = int(emb.shape[0]), int(emb.shape[1])
    toks = np.random.default_rng(seed).integers(0, n_vocab, n_tokens)
    x = gguf.dequantize(np.asarray(emb.data).reshape(n_vocab, -1)[toks], emb.tensor_type).reshape(n_tokens, n_embd)
    x = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6)
    out = []
    for il in range(int(reader.fields[f"{arch}.block_count"].parts[-1][0])):
        w = tensors.get(f"blk.{il}.ffn_gate_inp.weight")
        if w is None:
            continue
        logits = x @ np.asarray(w.data).reshape(-1, n_embd).T
        b = tensors.get(f"blk.{il}.ffn_gate_inp.bias")
        if b is not None:
            logits = logits + np.asarray(b.data)
        top = np.argsort(-logits, axis=1)[:, :k]
        out.append((il, len({tuple(sorted(t)) for t in top}), len(np.unique(top))))
    return out


#: the per-type and per-shape tables of a CPU probe record (cpu_probe.CpuRates.to_dict)
_PROBE_TABLES = ("decode_bytes_s", "prefill_flop_s", "half_batch", "attn_decode_s", "attn_prefill_s")


def _needs(files: list[tuple[str, str]], directory: Path) -> tuple[set[str], set[str]]:
    """The weight types and attention shapes the models of ``files`` (``(key, ftype)`` rows) need
    probed (cpu_probe.probe_needs, what ``kvtuner`` probes for a model before predicting it)."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.speed.cpu_probe import probe_needs

    types: set[str] = set()
    shapes: set[str] = set()
    for key, ft in files:
        t, sh = probe_needs(ModelProfile.from_gguf(fixture(key, ft, directory)))
        types |= set(t)
        shapes |= set(sh)
    return types, shapes


def probe_gaps(probe: dict, directory: Path) -> tuple[list[str], list[str]]:
    """What the extra rows' models need probed (:func:`_needs`) that the stored probe lacks: the
    stored-probe predictions use the nearest probed type / shape for them (cpu_probe.nearest,
    CpuRates.attn_cost)."""
    types, shapes = _needs([(key, ft) for key, _, _, ft in EXTRA_SHAPES], directory)
    return (
        sorted(x for x in types if x not in probe["prefill_flop_s"]),
        sorted(x for x in shapes if x not in probe["attn_prefill_s"]),
    )


def measure_probe_gaps(threads: int, directory: Path, probe: dict, data: dict) -> dict:
    """Probe this CPU (kvtuner.runner.probe.run_cpu_probe) for :func:`probe_gaps` and keep only those
    types' and shapes' entries in ``data["probe_gaps"]``: added to the stored probe they give the
    prediction ``kvtuner`` makes for these models on this CPU (its probe measures the types and
    shapes a model needs); the stored probe's fixed costs stay."""
    from kvtuner.runner.probe import run_cpu_probe

    types, shapes = probe_gaps(probe, directory)
    if not types and not shapes:
        return data
    t0 = time.time()
    rates = run_cpu_probe(types or ["Q4_K"], threads, attn_shapes=shapes or ("32/8/128",)).to_dict()
    keep = {
        "decode_bytes_s": types,
        "prefill_flop_s": types,
        "half_batch": types,
        "attn_decode_s": shapes,
        "attn_prefill_s": shapes,
    }
    data["probe_gaps"] = {
        **{k: {x: rates[k][x] for x in keep[k] if x in rates[k]} for k in _PROBE_TABLES},
        "load_avg": os.getloadavg()[0],
        "t_unix": time.time(),
        "wall_s": time.time() - t0,
    }
    EXTRA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"# probed {', '.join(types + shapes)}: {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    return data


def measure_current_probe(threads: int, directory: Path, rows: list[dict], data: dict) -> dict:
    """Probe this CPU now, as ``kvtuner probe`` does today (kvtuner.runner.probe.run_cpu_probe:
    each figure the fastest of 3 repetitions), for every weight type and attention shape of
    ``rows``; stored as ``data["probe_current"]``. The stored probe of speed_cpu_runs.json is
    older than that rule (each figure then a median over the tokens of one repetition, so a
    repetition slowed by another job raised it)."""
    from kvtuner.runner.probe import run_cpu_probe

    types, shapes = _needs([(r["key"], r["ftype"]) for r in rows], directory)
    t0 = time.time()
    rates = run_cpu_probe(sorted(types), threads, attn_shapes=sorted(shapes)).to_dict()
    data["probe_current"] = {**rates, "wall_s": time.time() - t0}
    EXTRA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(
        f"# probed {', '.join(sorted(types) + sorted(shapes))}: {time.time() - t0:.0f} s, load "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return data


#: Repetitions of a --measure-here bench (the median is kept): runs of one row differed by 10-15 %
#: between two sessions on one AMD EPYC VM, so three.
HERE_REPETITIONS = 3


def _cpu_name() -> str:
    """This CPU's model name and flags that matter to ggml-cpu (lscpu / /proc/cpuinfo)."""
    name, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "model name" and name == "unknown CPU":
                name = v.strip()
            elif k.strip() == "flags" and not flags:
                flags = set(v.split())
    except OSError:
        pass
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile") if f in flags]
    return f"{name} ({os.cpu_count()} CPUs; {', '.join(simd) or 'no AVX2'})"


def measure_here(threads: int, directory: Path, rows: list[dict], data: dict) -> dict:
    """Everything on this machine, cold, as ``kvtuner`` would predict it: one CPU probe
    (kvtuner.runner.probe.run_cpu_probe) of every weight type, attention shape and MoE expert
    shape the rows' models need (:func:`_needs`, cpu_probe.probe_expert_needs), then a bench of
    every row (median of :data:`HERE_REPETITIONS`). Stored as ``data["here"]`` (resumable: rows
    already there are kept). Nothing is fitted to these rows: the speed model's one MoE constant
    was fitted on another machine's granite row."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.speed.cpu_probe import probe_expert_needs
    from kvtuner.runner.probe import run_cpu_probe

    here = data.setdefault("here", {"cpu": _cpu_name(), "runs": []})
    if "probe" not in here:
        files = sorted({(r["key"], r["ftype"]) for r in rows})
        types, shapes = _needs(files, directory)
        experts = sorted(
            {e for key, ft in files for e in probe_expert_needs(ModelProfile.from_gguf(fixture(key, ft, directory)))}
        )
        t0 = time.time()
        rates = run_cpu_probe(
            sorted(types),
            threads,
            attn_shapes=sorted(shapes),
            expert_keys=experts,
            on_step=lambda k: print(f"#   probe {k}", flush=True),
        )
        here["probe"] = {**rates.to_dict(), "wall_s": time.time() - t0}
        EXTRA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(
            f"# probed {len(types)} types, {len(shapes)} attention shapes, {len(experts)} expert shapes: "
            f"{time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    done = {(r["key"], r["depth"]) for r in here["runs"]}
    for r in rows:
        if (r["key"], r["depth"]) in done:
            continue
        rec = {
            "key": r["key"],
            "ftype": r["ftype"],
            "set": "validate",
            **_bench(fixture(r["key"], r["ftype"], directory), r["depth"], threads, HERE_REPETITIONS),
        }
        here["runs"].append(rec)
        EXTRA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(
            f"# measured {r['key']} depth {r['depth']}: {rec['prefill_tok_s']:.1f} / {rec['decode_tok_s']:.2f} tok/s, "
            f"{rec['wall_s']:.0f} s, load {rec['load_avg']:.2f}",
            flush=True,
        )
    return data


def without_experts(probe: dict) -> dict:
    """A probe record without its expert entries (the experts' decode then goes at the dense rate
    of their type)."""
    return {k: v for k, v in probe.items() if not k.startswith("expert_")}


def with_gaps(probe: dict, gaps: dict) -> dict:
    """The stored probe with the :func:`measure_probe_gaps` entries added."""
    return {**probe, **{k: {**probe.get(k, {}), **gaps.get(k, {})} for k in _PROBE_TABLES}}


def check_routing(threads: int, directory: Path) -> list[dict]:
    """Bench each family shape's file with and without routing data (depth 0, -p 128 -n 4): with the
    routing tensors all zero every token picks the same experts, so a prefill reads n_expert_used
    experts per layer instead of up to all of them (1.14x faster for DeepSeek-V2-Lite's shapes; for
    gpt-oss's about 1x: a 2-layer file without routing data ran 66.1 tok/s, one with routing data and
    normal MXFP4 scales 67.6; the 3.4x this check showed before was the subnormal-scale artefact
    that ``write_mxfp4_scales`` removes).
    Returns one record per file."""
    from kvtuner.runner.bench import run_bench

    out = []
    for key, shape, _, ft in EXTRA_SHAPES:
        if shape not in FAMILY_SHAPES:
            continue
        for il, sets, hit in router_spread(fixture(key, ft, directory)):
            print(
                f"{key:24} layer {il}: {SV.CPU_PROMPT} random tokens pick {sets} distinct expert sets, "
                f"{hit} experts hit (routers computed from the file)"
            )
        for routing in (True, False):
            r = run_bench(
                fixture(key, ft, directory, routing=routing),
                SV.cpu_config(0),
                n_prompt=SV.CPU_PROMPT,
                n_gen=4,
                n_depth=0,
                repetitions=1,
                n_threads=threads,
                timeout_s=3600,
                idle_timeout_s=3600,
            )
            out.append(
                {
                    "key": key,
                    "routing": routing,
                    "prefill_tok_s": r.prefill_tok_s.median,
                    "decode_tok_s": r.decode_tok_s.median,
                    "load_avg": os.getloadavg()[0],
                }
            )
            print(
                f"{key:24} routing data {'yes' if routing else 'no ':3} | prefill {out[-1]['prefill_tok_s']:7.1f} "
                f"tok/s, decode {out[-1]['decode_tok_s']:6.2f} tok/s | load {out[-1]['load_avg']:.2f}",
                flush=True,
            )
        print(
            f"{key:24} prefill without / with routing data: x{out[-1]['prefill_tok_s'] / out[-2]['prefill_tok_s']:.2f}"
        )
    return out


def _table(rows: list[dict], markdown: bool, *, summary: bool = True) -> None:
    """Print predicted rows (:func:`predict`) as text or as a Markdown table, and how many
    figures of each set are within 25%."""
    if markdown:
        print("| row | set | prefill measured | predicted | error | decode measured | predicted | error | load |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    else:
        print(
            f"{'row':34} {'set':8} | {'prefill meas':>12} {'pred':>8} {'ratio':>6} {'err':>7} | "
            f"{'decode meas':>11} {'pred':>7} {'ratio':>6} {'err':>7} | load"
        )
    errs: dict[str, list[float]] = {"fit": [], "validate": []}
    for r in rows:
        rp, rd = r["pred_prefill"] / r["prefill_tok_s"], r["pred_decode"] / r["decode_tok_s"]
        errs[r["set"]] += [abs(rp - 1), abs(rd - 1)]
        load = r.get("load_avg", float("nan"))
        if markdown:
            same = " (same model)" if r["set"] == "validate" and r["key"] == FIT_ROW[0] else ""
            print(
                f"| {LABELS.get(r['key'], r['key'])} {r['ftype']} d{r['depth']} | {r['set']}{same} | "
                f"{r['prefill_tok_s']:.1f} | {r['pred_prefill']:.1f} | {rp - 1:+.0%} | {r['decode_tok_s']:.2f} | "
                f"{r['pred_decode']:.2f} | {rd - 1:+.0%} | {load:.2f} |"
            )
        else:
            print(
                f"{r['key'] + ' ' + r['ftype'] + ' d' + str(r['depth']):34} {r['set']:8} | {r['prefill_tok_s']:12.1f} "
                f"{r['pred_prefill']:8.1f} {rp:6.3f} {rp - 1:+7.1%} | {r['decode_tok_s']:11.2f} {r['pred_decode']:7.2f} "
                f"{rd:6.3f} {rd - 1:+7.1%} | {load:.2f}"
            )
    if summary:
        for s, e in errs.items():
            if e:
                print(
                    f"{'' if not markdown else chr(10)}  {s:8} max |error| {max(e):.1%}, figures within 25%: "
                    f"{sum(x <= 0.25 for x in e)}/{len(e)}"
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the efficiency on the fitting row and print it")
    ap.add_argument("--measure", action="store_true", help="bench the extra MoE shapes missing from moe_cpu_runs.json")
    ap.add_argument(
        "--check-routing",
        action="store_true",
        help="bench the family shapes with and without routing data (prefill should differ) and stop",
    )
    ap.add_argument(
        "--reprobe",
        action="store_true",
        help="probe this CPU now for every row's types and shapes (kept as probe_current) and show the rows with it",
    )
    ap.add_argument(
        "--measure-here",
        action="store_true",
        help="probe this CPU (types, attention and expert shapes) and bench every row on it (kept as 'here')",
    )
    ap.add_argument("--markdown", action="store_true", help="print the rows as a Markdown table and stop")
    ap.add_argument("--models-dir", default=None, help="where the sparse fixtures are written (default: a temp dir)")
    args = ap.parse_args(argv)
    directory = Path(args.models_dir or tempfile.mkdtemp(prefix="kvtuner-moe-"))
    directory.mkdir(parents=True, exist_ok=True)
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    probe = stored["probe"]
    if args.check_routing:
        check_routing(probe["n_threads"], directory)
        return 0
    rows = [r for r in stored["runs"] if r["key"] in MOE_KEYS]
    for r in rows:
        r["set"] = "fit" if (r["key"], r["ftype"], r["depth"]) == FIT_ROW else "validate"
    extra = json.loads(EXTRA.read_text(encoding="utf-8")) if EXTRA.exists() else {}
    if args.measure:
        extra = measure(probe["n_threads"], directory, extra)
        if "probe_gaps" not in extra:
            extra = measure_probe_gaps(probe["n_threads"], directory, probe, extra)
    order = [k for k, *_ in EXTRA_SHAPES]
    rows += sorted(
        extra.get("runs", []), key=lambda r: (order.index(r["key"]) if r["key"] in order else len(order), r["depth"])
    )
    if args.measure_here:
        extra = measure_here(probe["n_threads"], directory, rows, extra)
    measured_here = [h for h in (*extra.get("here_earlier", []), extra.get("here")) if h and h.get("runs")]
    for here in measured_here:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(here["probe"]["t_unix"]))
        hr = sorted(here["runs"], key=lambda r: ([r["key"] for r in rows].index(r["key"]), r["depth"]))
        mla = any(
            k.partition("@")[0].count("/") == 3 for k in here["probe"].get("attn_decode_s", {})
        )  # an MLA key (cpu_probe.attn_key)
        print(
            f"{'' if not args.markdown else '### '}every row on {here['cpu']}, cold: this CPU's probe ({when} UTC, "
            f"load {here['probe']['load_avg']:.2f}) with the expert probe of each model's expert shapes (decode)"
            f"{'' if mla else ' but no MLA attention probe (DeepSeek at the nearest GQA shape, scaled by the head size)'}; "
            f"host_moe_prefill_efficiency as fitted on the Intel VM, nothing fitted here; -p {SV.CPU_PROMPT} -n {SV.CPU_GEN}, {probe['n_threads']} thread, "
            f"median of {'/'.join(map(str, sorted({r['repetitions'] for r in hr})))}"
        )
        _table(predict(hr, here["probe"], directory), args.markdown)
        print(
            f"\n{'' if not args.markdown else '### '}the same rows without the expert probe (the experts' "
            f"decode at the dense rate of their type)"
        )
        _table(predict(hr, without_experts(here["probe"]), directory), args.markdown)
        print()
    if measured_here and (args.markdown or args.measure_here):
        return 0
    gaps = extra.get("probe_gaps")
    # as kvtuner predicts: its probe measures the types and shapes a model needs, so the stored
    # probe plus this CPU's probe of what it lacks (the fitting and older rows use none of those)
    full = with_gaps(probe, gaps) if gaps else probe
    current = extra.get("probe_current")
    if args.reprobe:
        extra = measure_current_probe(probe["n_threads"], directory, rows, extra)
        current = extra["probe_current"]
    if args.fit:
        print(f"host_moe_prefill_efficiency = {fit(rows, full, directory):.3f}")
        if current:
            print(f"  with the current probe: {fit(rows, current, directory):.3f}")
        return 0
    names = sorted({x for k in _PROBE_TABLES for x in (gaps or {}).get(k, {})})
    print(
        f"{'' if not args.markdown else '### '}MoE rows on this CPU, cold (the probe of {STORED.name}"
        + (f" plus this CPU's probe of {', '.join(names)}, which it lacks" if names else "")
        + f"; no calibration; -p {SV.CPU_PROMPT} -n {SV.CPU_GEN}, {probe['n_threads']} thread)"
    )
    _table(predict(rows, full, directory), args.markdown)
    if current:
        eff = fit(rows, current, directory)
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(current["t_unix"]))
        print(
            f"\n{'' if not args.markdown else '### '}every row with this CPU's current probe ({when} UTC, load "
            f"{current['load_avg']:.2f}; each figure the fastest of 3 repetitions) and the expert efficiency "
            f"refitted on the fitting row with it: {eff:.3f}"
        )
        _table(predict(rows, current, directory, eff), args.markdown)
    if args.markdown:
        return 0
    if gaps:
        print(
            f"\nthe extra rows with the stored probe alone (its nearest type or shape standing in for "
            f"{', '.join(names)}; those probed at load {gaps['load_avg']:.2f}):"
        )
        _table(predict(extra.get("runs", []), probe, directory), False, summary=False)
    anchored = [r for r in rows if "anchor" in r]
    if anchored:
        (fit_row,) = [r for r in rows if (r["key"], r["ftype"], r["depth"]) == FIT_ROW and "anchor" not in r]
        print(
            "\nrows measured beside other jobs, read against the anchor (the fitting row benched just before and"
            " after,\nwhose quiet-machine speed is stored): measured x (anchor quiet / anchor now)"
        )
        for r in predict(anchored, full, directory):
            fp = fit_row["prefill_tok_s"] / r["anchor"]["prefill_tok_s"]
            fd = fit_row["decode_tok_s"] / r["anchor"]["decode_tok_s"]
            mp, md = r["prefill_tok_s"] * fp, r["decode_tok_s"] * fd
            print(
                f"{r['key'] + ' ' + r['ftype'] + ' d' + str(r['depth']):34} {r['set']:8} | slowdown x{fp:.2f} / "
                f"x{fd:.2f} | prefill {mp:7.1f} pred {r['pred_prefill']:7.1f} err {r['pred_prefill'] / mp - 1:+7.1%} | "
                f"decode {md:6.2f} pred {r['pred_decode']:6.2f} err {r['pred_decode'] / md - 1:+7.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
