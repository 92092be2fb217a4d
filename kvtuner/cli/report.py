"""Text renderings of model profiles and assessments (CLI output).

The JSON document of ``kvtuner plan --json`` is :meth:`kvtuner.core.session.Assessment.to_dict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.llama_report import METHOD_EMBEDDED
from ..core.model.profile import ModelProfile
from ..core.plan.buffers import buffer_device
from ..core.plan.llama_constants import output_buffer_bytes
from ..core.plan.memory_plan import MemoryPlan
from ..core.units import MiB, fmt_bytes

if TYPE_CHECKING:  # pragma: no cover
    from ..core.session import Assessment
    from ..core.speed.speed_model import SpeedPrediction


def _table(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def model_text(m: ModelProfile) -> str:
    """Human summary of a model profile (``kvtuner inspect``)."""
    heads = (
        f"{m.n_head[0]} heads / {m.n_head_kv[0]} KV heads"
        if len(set(m.n_head_kv)) == 1
        else f"{m.n_head[0]} heads / KV heads per layer {list(m.n_head_kv)}"
    )
    lines = [
        f"{m.name or m.file_name}",
        f"  file          {m.path}  ({fmt_bytes(m.file_bytes)}{f', {len(m.parts)} parts' if len(m.parts) > 1 else ''})",
        f"  architecture  {m.architecture}   quant {m.file_type or '?'}   {m.n_params / 1e6:,.1f} M parameters",
        f"  layers        {m.n_layer}   n_embd {m.n_embd}   {m.attention_kind}: {heads}, head size K {m.head_dim_k} / V {m.head_dim_v}",
        f"  context       trained {m.n_ctx_train}"
        + (f"   sliding window {m.n_swa} on {sum(m.swa_layers)} of {m.n_layer} layers" if m.n_swa else ""),
        f"  vocabulary    {m.n_vocab}",
        f"  weights       input {fmt_bytes(m.input_bytes)} (host)   layers {fmt_bytes(sum(m.layer_bytes))}   "
        f"output {fmt_bytes(m.output_bytes)}{' (tied to token_embd)' if m.tied_output else ''}",
    ]
    st = m.structure
    lines.append(f"  memory        {st.summary()} ({st.memory}; structure: {st.source})")
    if m.is_mla:
        lines.append(
            f"  MLA           kv_lora_rank {m.mla_kv_lora_rank}, K-only cache of {m.head_dim_k} per token per layer"
        )
    if any(m.recurrent_layers):
        lines.append(
            f"  recurrent     {sum(m.recurrent_layers)} layers, {m.recurrent_state_floats} f32 state per layer per sequence"
        )
    for w in m.warnings:
        lines.append(f"  note: {w}")
    return "\n".join(lines)


def planned_for_text(plan: MemoryPlan) -> str:
    """The devices a plan is for, by name, in one line: ``planned for: CUDA0 RTX 3060 12GB
    (what-if) 12.00 GiB; RAM 32.00 GiB`` (a catalogue card named as ``--gpu`` gave it, a generic
    one as ``what-if 12 GiB GPU``, a detected one by its driver name), or ``CPU only``."""
    gpus = [
        f"{d.backend_device} {d.name} {fmt_bytes(d.capacity_bytes)}"
        if d.capacity_bytes
        else f"{d.backend_device} {d.name}"
        for d in plan.devices
        if d.kind != "host"
    ]
    ram = f"RAM {fmt_bytes(plan.host.capacity_bytes)}" if plan.host.capacity_bytes else "RAM unknown"
    return f"planned for: {', '.join(gpus) if gpus else 'CPU only'}; {ram}"


def plan_text(assessment: Assessment) -> str:
    """Human-readable assessment: config line, KV caches, a per-device table, predicted speed,
    warnings and advice (each with its fix as command-line flags)."""
    plan, verified, speed = assessment.plan, assessment.verified, assessment.speed
    advice = [a.to_dict() for a in assessment.advice]
    m, c = plan.model, plan.config
    ngl = "all" if c.n_gpu_layers < 0 else str(c.n_gpu_layers)
    gpu_note = (
        (
            f"{plan.n_gpu_repeating}/{m.n_layer} layers + output on GPU"
            if plan.output_on_gpu
            else f"{plan.n_gpu_repeating}/{m.n_layer} layers on GPU"
        )
        if plan.gpus
        else "no GPU: all on CPU"
    )
    lines = [
        f"{m.name or m.file_name} ({m.architecture}, {m.file_type or '?'}, {m.n_layer} layers, {m.attention_kind})",
        f"n_ctx {plan.n_ctx} (n_ctx_seq {plan.n_ctx_seq} x {plan.n_stream} stream{'s' if plan.n_stream > 1 else ''}), "
        f"-ngl {ngl} ({gpu_note}), KV {c.type_k}/{c.type_v}, flash_attn {c.flash_attn}, n_ubatch {plan.n_ubatch}"
        + (", swa_full" if c.swa_full else ""),
        f"layers: {m.structure.summary()} ({_structure_source(plan)})",
        planned_for_text(plan),
        "",
    ]
    rows = [["KV cache", "cells", "layers", "K", "V", "total"]]
    for kc in plan.kv_caches:
        rows.append(
            [
                kc.kind,
                str(kc.cells),
                str(kc.layers),
                fmt_bytes(kc.k_bytes),
                fmt_bytes(kc.v_bytes),
                fmt_bytes(kc.kv_bytes),
            ]
        )
    rows.append(["all", "", "", "", "", fmt_bytes(plan.kv_bytes)])
    lines.append(_table(rows, {1, 2, 3, 4, 5}))
    lines.append(f"KV per token of context: {fmt_bytes(plan.kv_bytes_per_token())}")
    lines.append("")
    rows = [["device", "weights", "KV", "compute", "output", "overhead", "total", "capacity", "left"]]
    for d in plan.devices:
        left = d.headroom_bytes
        rows.append(
            [
                d.backend_device if d.kind != "host" else "host",
                fmt_bytes(d.weights_bytes) + (" (mmap)" if d.weights_mapped and d.weights_bytes else ""),
                fmt_bytes(d.kv_bytes),
                fmt_bytes(d.compute_bytes),
                fmt_bytes(d.output_bytes),
                fmt_bytes(d.overhead_bytes),
                fmt_bytes(d.total_bytes),
                fmt_bytes(d.capacity_bytes),
                "-" if left is None else (fmt_bytes(left) if left >= 0 else f"OVER by {fmt_bytes(-left)}"),
            ]
        )
    lines.append(_table(rows, {1, 2, 3, 4, 5, 6, 7, 8}))
    lines.append(fit_line(assessment))
    h = plan.host
    if h.repack_bytes or h.mapped_bytes:
        lines.append(
            f"host as the OS sees it: {fmt_bytes(h.mapped_bytes)} of mapped file pages (reclaimable) + "
            f"{fmt_bytes(h.committed_bytes)} committed"
            + (
                f" (includes ggml-cpu's {fmt_bytes(h.repack_bytes)} CPU_REPACK copy of the quantized weights)"
                if h.repack_bytes
                else ""
            )
        )
    if plan.model.n_expert and any(d.expert_bytes for d in plan.devices):
        where = ", ".join(
            f"{'host' if d.kind == 'host' else d.backend_device} {fmt_bytes(d.expert_bytes)} ({d.expert_layers} layers)"
            for d in plan.devices
            if d.expert_bytes
        )
        lines.append(
            f"MoE experts (part of weights): {where}"
            + (f"; {len(plan.moves.moved)} tensors moved by --n-cpu-moe/--cpu-moe/-ot" if plan.moves.moved else "")
        )
    lines.append(f"compute buffers: {plan.compute.label}")
    rules = getattr(plan, "rules", None)
    if rules is not None:
        lines.append(f"planned as: {rules.label}")
    if verified is not None:
        lines.append("")
        method = verified.method or METHOD_EMBEDDED
        who = verified.engine or "llama.cpp"
        measured = ["KV cache"] + (["recurrent state"] if verified.recurrent else [])
        if plan.compute.source == "dry-run":
            measured.append("compute buffers")
        lines.append(
            f"verified by {who} ({method}); llama.cpp measured the {', '.join(measured)} above"
            + (
                ""
                if plan.compute.source == "dry-run"
                else f"; the compute buffers above are kvtuner's estimate (llama.cpp ran on "
                f"{', '.join(verified.devices) or 'other devices'}, not on the devices planned)"
            )
            + ":"
        )
        rows = [["buffer", "cells", "layers", "kvtuner", "llama.cpp"]]
        attn = [kc for kc in plan.kv_caches if kc.kind != "recurrent"]
        theirs = [vc for vc in verified.kv_caches if vc.layers > 0]
        for i, vc in enumerate(theirs):
            kc = attn[i] if i < len(attn) else None
            rows.append(
                [
                    f"KV {kc.kind}" if kc else "KV ?",
                    str(vc.cells),
                    str(vc.layers),
                    f"{kc.kv_bytes / MiB:.2f} MiB" if kc else "-",
                    f"{vc.size_mib:.2f} MiB",
                ]
            )
        rec = [kc for kc in plan.kv_caches if kc.kind == "recurrent"]
        for r in verified.recurrent:
            rows.append(
                [
                    "recurrent state",
                    str(r.cells),
                    str(rec[0].layers) if rec else "?",
                    f"{rec[0].kv_bytes / MiB:.2f} MiB" if rec else "-",
                    f"{r.state_mib:.2f} MiB",
                ]
            )
        for dev, mib in verified.compute_mib.items():
            planned = plan.compute.estimate_on(buffer_device(dev))
            rows.append([f"compute {dev}", "", "", f"{planned / MiB:.2f} MiB (est.)", f"{mib:.2f} MiB"])
        for dev, mib in verified.output_mib.items():
            planned = output_buffer_bytes(m.n_vocab, c.n_seq)
            rows.append([f"output {dev}", "", "", f"{planned / MiB:.2f} MiB", f"{mib:.2f} MiB"])
        lines.append(_table(rows, {1, 2, 3, 4}))
        lines += _comparison_text(assessment)
    if speed is not None:
        lines.append("")
        lines.append(_speed_text(speed))
    for w in plan.warnings:
        lines.append(f"note: {w}")
    if advice:
        from ..core.advice.advisor import fix_flags

        for a in advice:
            lines.append(f"[{a.get('severity', 'info')}] {a.get('id', '')}: {a.get('message', '')}")
            fix = a.get("fix") or {}
            if fix:
                lines.append(f"    fix: {fix_flags(fix)}")
    return "\n".join(lines)


def fit_line(assessment: Assessment) -> str:
    """The one fit verdict in a line (:attr:`kvtuner.core.session.Assessment.verdict`): its level
    in capitals, why, and the margins it used with their source."""
    v = assessment.verdict
    return f"fit: {v.level.upper()} -- {v.detail} (margin: {v.margins.source})"


def _comparison_text(assessment: Assessment) -> list[str]:
    """llama.cpp's figures per device beside kvtuner's analytic ones
    (:func:`kvtuner.core.session.device_comparison`), differences over 2% / 8 MiB marked."""
    from ..core.session import device_comparison

    v = assessment.verified
    if v is None or not v.breakdown:
        return []
    who = v.engine or "llama.cpp"

    def cell(x: float | None) -> str:
        return "-" if x is None else (f"{x} MiB" if isinstance(x, int) else f"{x:.2f} MiB")

    rows = [["device", "column", f"{who}", "kvtuner (analytic)", ""]]
    for entry in device_comparison(v, assessment.analytic):
        t, o, diff = entry["llama_cpp"] or {}, entry["kvtuner"] or {}, entry["differs"]
        for label, tk, ok, dk in (
            ("model", "model_mib", "weights_mib", "model"),
            ("context", "context_mib", "kv_mib", "context"),
            ("compute", "compute_mib", "compute_mib", "compute"),
        ):
            rows.append(
                [
                    entry["device"] if label == "model" else "",
                    label,
                    cell(t.get(tk)),
                    cell(o.get(ok)),
                    "DIFFERS" if diff[dk] else "",
                ]
            )
    return [
        "",
        f"{who}'s own memory breakdown (integer MiB as printed; context = KV + recurrent state) "
        "beside kvtuner's analytic plan:",
        _table(rows, {2, 3}),
    ]


def _structure_source(plan: MemoryPlan) -> str:
    """Where the plan's per-layer structure comes from, in words."""
    st = plan.model.structure
    if st.source == "analytic":
        return "kvtuner's rule for this architecture, tested against llama.cpp"
    if st.source == "probe":
        return f"read from {st.llama_build or 'llama.cpp'}"
    return "verified by llama.cpp's dry run" if plan.verified else "APPROXIMATE: no tested rule, llama.cpp not asked"


def _speed_text(speed: SpeedPrediction) -> str:
    """Predicted speed lines: decode at depth 0 and full context with their speed badges, prefill."""
    from ..core.speed.speed_model import speed_band

    lo, hi = speed.band
    plo, phi = speed.prefill_band
    cal = (
        f"calibrated on {speed.n_calibration_runs} run{'s' if speed.n_calibration_runs != 1 else ''}"
        if speed.n_calibration_runs
        else "uncalibrated"
    )
    if any("CPU kernels: assumed" in s for s in speed.sources):  # speed_model.fallback_cpu_rates
        cal += ", assumed CPU rates: no probe of this model's kernels yet"
    return "\n".join(
        [
            f"predicted speed ({speed.n_threads} thread{'s' if speed.n_threads != 1 else ''}, {cal}"
            f"{', for ' + str(speed.host['name']) if speed.host and speed.host.get('what_if') else ''}):",
            f"  decode   {speed.decode_tok_s:8.2f} tok/s empty cache [{speed_band(speed.decode_tok_s)}]"
            f"  (likely {lo:.2f}-{hi:.2f}),  {speed.decode_tok_s_at_full_ctx:.2f} tok/s at full context "
            f"[{speed_band(speed.decode_tok_s_at_full_ctx)}]",
            f"  prefill  {speed.prefill_tok_s:8.1f} tok/s ({speed.prefill_tokens}-token prompt)"
            + (f"  (likely {plo:.1f}-{phi:.1f})" if phi > 0 else ""),
            *([f"  {speed.range_note}"] if speed.range_note else []),
        ]
    )


def workload_text(workload: object, llama: object, vllm: object | None, advice: str) -> str:
    """The workload section of ``plan``: KV of the worst, P95 and expected cases for llama.cpp (this
    configuration) and vLLM (paged blocks, prefix caching), and which case the pool is safe for."""
    w = workload
    desc = [f"{w.n_seq} sequence(s), window {w.window_tokens}"]  # type: ignore[attr-defined]
    if w.avg_tokens is not None:  # type: ignore[attr-defined]
        desc.append(f"average {w.avg_tokens}")  # type: ignore[attr-defined]
    if w.p95_tokens is not None:  # type: ignore[attr-defined]
        desc.append(f"P95 {w.p95_tokens}")  # type: ignore[attr-defined]
    if w.shared_prefix_tokens:  # type: ignore[attr-defined]
        desc.append(f"shared prefix {w.shared_prefix_tokens}")  # type: ignore[attr-defined]
    rows = [["KV for the workload", "worst case", "P95", "expected", "prefix saved"]]
    for label, kv in (
        ("llama.cpp" + (" (unified)" if llama.unified else " (split streams)"), llama),  # type: ignore[attr-defined]
        ("vLLM (16-token blocks)", vllm),
    ):
        if kv is None:
            continue

        def cell(tokens: int | None) -> str:
            return "-" if tokens is None else f"{fmt_bytes(kv.bytes(tokens))} ({tokens})"  # type: ignore[attr-defined]  # noqa: B023

        rows.append(
            [
                label,
                cell(kv.worst_tokens),
                cell(kv.p95_tokens),
                cell(kv.expected_tokens),  # type: ignore[attr-defined]
                fmt_bytes(kv.bytes(kv.shared_saving_tokens)),
            ]
        )  # type: ignore[attr-defined]
    notes = [
        "llama-server shares no prefix between requests (only a request's own n_cmpl children, via "
        "llama_memory_seq_cp); vLLM's prefix caching stores the prefix's full blocks once"
    ]
    if not llama.unified:  # type: ignore[attr-defined]
        notes.append("split streams are allocated whole: use --kv-unified to size the pool by the expected case")
    return "\n".join(
        [
            f"workload: {', '.join(desc)}",
            _table(rows, {1, 2, 3, 4}),
            f"advice: {advice}",
            *(f"note: {n}" for n in notes),
        ]
    )


def vllm_text(plan: object, gpu_name: str) -> str:
    """vLLM's budget on one card, as its start-up log would print it."""
    p = plan
    s = p.settings  # type: ignore[attr-defined]
    src = p.sources  # type: ignore[attr-defined]
    lines = [
        f"vLLM on {gpu_name} (total_gpu_memory {fmt_bytes(p.total_bytes)} x {s.gpu_memory_utilization} = "  # type: ignore[attr-defined]
        f"{fmt_bytes(p.usable_bytes)}, engine {s.engine}, kv_cache_dtype {s.kv_cache_dtype}):",  # type: ignore[attr-defined]
        f"  weights {fmt_bytes(p.weights_bytes)} ({src['weights']}), activation peak "  # type: ignore[attr-defined]
        + (
            f"unknown ({p.batched_tokens} tokens)"
            if p.unknown  # type: ignore[attr-defined]
            else f"{fmt_bytes(p.activation_bytes)} ({src['activation']}, {p.batched_tokens} tokens)"
        )  # type: ignore[attr-defined]
        + f", non-torch {fmt_bytes(p.non_torch_bytes)} ({src['non_torch']})",  # type: ignore[attr-defined]
    ]
    if p.unknown:  # type: ignore[attr-defined]
        lines.append("  # GPU blocks: unknown, maximum concurrency unknown (see the note)")
    else:
        lines += [
            f"  KV cache {fmt_bytes(p.available_kv_bytes)}: # GPU blocks: {p.num_blocks} "  # type: ignore[attr-defined]
            f"({fmt_bytes(p.block_bytes)} each), GPU KV cache size: {p.kv_tokens:,} tokens",  # type: ignore[attr-defined]
            f"  Maximum concurrency for {s.max_model_len:,} tokens per request: {p.max_concurrency:.2f}x",  # type: ignore[attr-defined]
        ]
    if p.fits is False:  # type: ignore[attr-defined]
        lines.append(
            f"  vLLM would refuse to start: --max-model-len {s.max_model_len} exceeds the {p.kv_tokens} KV tokens"
        )  # type: ignore[attr-defined]
    lines += [f"  note: {n}" for n in p.notes]  # type: ignore[attr-defined]
    return "\n".join(lines)


def table_text(model_name: str, gpu_name: str, gpu_bytes: int, weights_bytes: int, cells: list) -> str:
    """The decision table: one row per (sequences, window), one column per KV type, each cell
    ``fits``/``no`` with the total and roofline tok/s."""
    kv_types = list(dict.fromkeys(c.kv_type for c in cells))
    per = {c.kv_type: c.kv_bytes_per_token for c in cells}
    head = ["seqs", "window", *[f"{t} ({fmt_bytes(per[t])}/token)" for t in kv_types]]
    rows = [head]
    by_key: dict = {}
    for c in cells:
        by_key.setdefault((c.n_seq, c.window), {})[c.kv_type] = c
    for (s, w), d in by_key.items():
        row = [str(s), str(w)]
        for t in kv_types:
            c = d[t]
            tok = f", {c.decode_tok_s:.0f} tok/s" if c.decode_tok_s is not None else ""
            row.append(
                f"{'fits' if c.fits else 'no  '} KV {fmt_bytes(c.kv_bytes)}, total {fmt_bytes(c.total_bytes)}{tok}"
            )
        rows.append(row)
    return "\n".join(
        [
            f"decision table: {model_name} on {gpu_name} ({fmt_bytes(gpu_bytes)}), weights {fmt_bytes(weights_bytes)}, "
            "+1 GiB overhead (CUDA context, compute buffer)",
            _table(rows, {0, 1}),
            "KV = sequences x window x 2 x n_layer x n_kv_head x head_dim x bytes/element; tok/s = aggregate decode "
            "roofline (sequences x bandwidth / (weights + KV)), an upper bound",
        ]
    )


def extras_text(plan: object, xp: object) -> list[str]:
    """Text lines of the projector / draft / LoRA plan (:class:`kvtuner.core.plan.extras.ExtrasPlan`):
    one line per part and device, then each device's total with them against its capacity."""
    from ..core.units import fmt_bytes

    lines = ["besides the model:"]
    parts: dict[tuple[str, str], dict[str, int]] = {}
    sources: dict[str, list[str]] = {}
    for s in xp.segments:
        parts.setdefault((s.part, s.device), {})[s.kind] = parts.get((s.part, s.device), {}).get(s.kind, 0) + s.bytes
        if s.source not in sources.setdefault(s.part, []):
            sources[s.part].append(s.source)
    for (part, dev), kinds in parts.items():
        body = "  ".join(f"{k} {fmt_bytes(b)}" for k, b in kinds.items())
        lines.append(f"  {part:<7}{dev:<7}{body}  ({'; '.join(sources[part])})")
    if xp.image_tokens:
        lines.append(f"  one image takes {xp.image_tokens} context tokens")
    extra = xp.bytes_by_device()
    for d in plan.devices:
        add = extra.get(d.device, 0)
        if not add:
            continue
        # the plan's totals count them already (DevicePlan.extras_bytes)
        total = d.total_bytes + (0 if getattr(d, "extras_bytes", 0) else add)
        cap = d.capacity_bytes
        verdict = (
            "" if cap is None else (" fits" if total <= cap else f" DOES NOT FIT (over by {fmt_bytes(total - cap)})")
        )
        lines.append(
            f"  {d.backend_device} with them: {fmt_bytes(total)}"
            + ("" if cap is None else f" of {fmt_bytes(cap)}")
            + verdict
        )
    lines += [f"  note: {n}" for n in xp.notes]
    return lines


def extras_speed_text(speed: dict) -> list[str]:
    """Text lines of ``extras.speed``: the speculative tokens/s range and one image's encode time,
    each with its assumptions."""
    lines: list[str] = []
    spec = speed.get("speculative")
    if spec:
        lo, hi = spec["tok_s"]
        lines.append(
            f"  speculative decode: {lo:.2f}-{hi:.2f} tok/s (without the draft {spec['plain_tok_s']:.2f}; "
            f"draft alone {spec['draft_tok_s']:.2f})"
        )
        lines += [f"    assuming {a}" for a in spec["assumptions"]]
    if speed.get("image_encode_s") is not None:
        lines.append(
            f"  one image encodes in {speed['image_encode_s']:.2f} s (prefill; {speed['image_encode_assumption']})"
        )
    lines += [f"  {w}" for w in speed.get("why", ())]
    return lines
