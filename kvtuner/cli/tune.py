"""``kvtuner tune``: the fastest configuration that fits a goal, explained, optionally confirmed
with real loads (:mod:`kvtuner.core.tune`)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from .args import (
    UserError,
    add_config_args,
    add_engine_arg,
    add_hardware_args,
    add_model_arg,
    add_record_anyway_arg,
    add_threads_arg,
    add_tune_args,
    config_from_args,
    emit_json,
    engine_from_args,
    ensure_cpu_probe,
    hardware_flags,
    load_model,
    session_from_args,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..core.plan.config import PlanConfig
    from ..core.plan.verdict import FitVerdict
    from ..core.tune import Candidate, TuneResult
    from ..core.tune.confirm import RealLoad
    from ..core.tune.fit_choice import FitChoice


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tune``."""
    p = sub.add_parser(
        "tune",
        help="find the fastest configuration that fits a goal (headless)",
        description="Search n_gpu_layers, KV layers on the GPU, MoE experts (--n-cpu-moe) or dense FFN (--n-cpu-ffn) "
        "in RAM, K/V types within the quality floor, flash attention and n_ubatch for the fastest predicted decode at the full context that fits every device "
        "(1 GiB VRAM margin, 20 %% of RAM free); explain the choice, the runner-up and what llama.cpp's "
        "--fit would run.",
    )
    add_model_arg(p)
    add_engine_arg(p)
    add_config_args(p)
    add_hardware_args(p)
    add_tune_args(p)
    add_threads_arg(p, "to predict (and run) with")
    add_record_anyway_arg(p, "the CPU probe this command starts and its real loads (--runs)")
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (schema kvtuner.tune/1: docs/reference/tune-json.md)",
    )
    p.set_defaults(func=cmd_tune)


def _goal(args: argparse.Namespace) -> object:
    from ..core.tune import TuneError, TuneGoal

    try:
        return TuneGoal(n_ctx=args.ctx, n_ctx_min=args.ctx_min, min_tok_s=args.min_tok_s, kv_quality=args.kv_quality)
    except TuneError as exc:
        raise UserError(str(exc)) from None


def cmd_tune(args: argparse.Namespace) -> int:
    """``kvtuner tune``."""
    from ..core.plan.config import ConfigError
    from ..core.tune import TuneError

    if not 0 <= args.runs <= 3:
        raise UserError(f"--runs must be between 0 and 3, not {args.runs}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be 1 or more (leave it out for the physical cores), not {args.threads}")
    goal = _goal(args)
    model = load_model(args.model)
    goal_ctx = args.ctx
    args.ctx = None  # the goal's context, not the base configuration's
    base = config_from_args(args, model=model)
    args.ctx = goal_ctx
    session = session_from_args(args, model, base)
    if args.threads is not None:
        session.n_threads = args.threads
    if args.runs and any(g.what_if for g in session.gpus):
        raise UserError(
            "--runs loads the model on this machine: it cannot confirm a what-if card (--gpu/--gpu-mem); use --runs 0"
        )
    if args.runs and session.host is not None and session.host.what_if:
        raise UserError(
            "--runs loads the model on this machine: it cannot confirm a what-if host "
            "(--host-mem/--host-bw/--host-cores/--pcie); use --runs 0"
        )
    from ..core.tune import kv_type_pairs

    # the tune ranks every K/V pair its quality floor allows: probe the CPU attention with each
    note = ensure_cpu_probe(
        session,
        args,
        quiet=args.json,
        kv_pairs=kv_type_pairs(model, goal.kv_quality, gpu=bool(session.gpus)),
        # real loads (--runs) must not run beside a probe: each would slow the other
        default_mode="now" if args.runs else "background",
    )
    if note:
        print(note, file=sys.stderr)
    loads: list = []
    dry = ""
    try:
        if args.runs:
            result = session.tune(goal)  # type: ignore[arg-type]
            if result.best is not None:
                dry = _dry_run(model.path, result.best)
                if dry.startswith("refused"):
                    raise UserError(f"llama.cpp {dry}")
            measure = _measure(model.path, session.threads(), args.record_anyway)
            result, loads = session.confirm_tune(
                goal,
                measure,
                args.runs,  # type: ignore[arg-type]
                on_load=None if args.json else _print_load,
            )
        else:
            result = session.tune(goal)  # type: ignore[arg-type]
    except (ConfigError, TuneError) as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    fit, fit_error = fit_choice(args, session, goal, model.path)
    trained = trained_context_warning(result.best)
    if trained and args.json:
        print(f"kvtuner: warning: {trained}", file=sys.stderr)
    given = _given_verdict(session, base, goal)
    trade = quality_trade(session, goal, result)
    if args.json:
        doc = result.to_dict()
        doc["fit_choice"] = fit.to_dict() if fit is not None else None
        doc["fit_choice_error"] = fit_error
        doc["model_path"] = str(model.path)
        doc["hardware"] = hardware_flags(args)
        doc["real_loads"] = [l.to_dict() for l in loads]
        doc["dry_run"] = dry or None
        doc["explanation"] = explain(result, fit, fit_error)
        doc["given_fit"] = given.to_dict() if given is not None else None
        doc["quality_trade"] = trade
        emit_json(doc)
    else:
        lines = explain(result, fit, fit_error)
        if trained:
            lines.append(f"[warning] ctx-exceeds-train: {trained}")
        lines += trade_lines(trade)
        if given is not None:
            lines.append(
                f"given:     the configuration as given, at {goal.n_ctx} tokens, is {given.level.upper()} -- "
                f"{given.detail}"
            )
        if dry:
            lines.append(f"dry run: {dry}")
        for l in loads:
            lines.append(_load_line(l))
        print("\n".join(lines))
    return 0 if result.best is not None else 1


def trained_context_warning(best: Candidate | None) -> str:
    """The advisor's ``ctx-exceeds-train`` warning for the chosen configuration, as ``plan``
    gives it (:func:`kvtuner.core.advice.advisor` rule ``_rule_ctx_train``: each sequence's
    context past the model's training context degrades output unless RoPE scaling is set), with
    the ``--ctx`` that stays within it; "" when the context is within it."""
    if best is None:
        return ""
    p, m = best.plan, best.plan.model
    if not m.n_ctx_train or p.n_ctx_seq <= m.n_ctx_train:
        return ""
    per_seq = m.n_ctx_train * (1 if p.config.kv_unified else p.config.n_seq)
    return (
        f"Each sequence gets {p.n_ctx_seq} tokens of context, more than the {m.n_ctx_train} the model was "
        f"trained on: positions past the trained length degrade output unless RoPE scaling is set "
        f"(--ctx {per_seq} stays within it)"
    )


def _given_verdict(session: object, base: PlanConfig, goal: object) -> FitVerdict | None:
    """The fit verdict of the configuration as the user gave it, at the goal's context (None for
    a goal without one, or a configuration that cannot be planned): the same verdict ``plan``
    prints, so ``tune`` and ``plan`` agree on it."""
    from ..core.plan.config import ConfigError
    from ..core.plan.verdict import fit_verdict

    s: Any = session
    g: Any = goal
    if g.n_ctx is None:
        return None
    try:
        s.config = base.with_(n_ctx=g.n_ctx)
        return fit_verdict(s.plan(), s.margins)
    except ConfigError:
        return None
    finally:
        s.config = base


def quality_trade(session: object, goal: object, result: TuneResult) -> list[dict]:
    """The trade across KV quality levels (:func:`kvtuner.core.tune.quality_trade`) as JSON rows,
    each with a short description of its configuration (``short``)."""
    from ..core.tune import quality_trade as trade

    s: Any = session
    g: Any = goal
    return [
        dict(level.to_dict(), short=_short(level.config) if level.config is not None else "")
        for level in trade(g, result, s.tune)
    ]


def trade_lines(trade: list[dict]) -> list[str]:
    """The quality trade as text: one ``quality:`` line with each level's best speed, then one line
    per level with its configuration and what it costs."""
    if not trade:
        return []
    parts = [
        f"{t['kv_quality']} "
        + (f"{t['decode_tok_s_at_full_ctx']:.3g} tok/s" if t["fits"] else "nothing fits")
        + (" (chosen)" if t["chosen"] else "")
        for t in trade
    ]
    lines = ["quality:   best decode at the full context per KV quality floor: " + " | ".join(parts)]
    for t in trade:
        lines.append(f"           {t['kv_quality']}: {t['short'] or 'nothing fits'}; {t['note']}")
    return lines


def fit_choice(
    args: argparse.Namespace, session: object, goal: object, model_path: object
) -> tuple[FitChoice | None, str | None]:
    """llama.cpp's ``--fit`` choice beside the tune (:func:`kvtuner.runner.fit_params.fit_choice_for`):
    the engine's llama-fit-params on this machine's devices, or the port of common/fit.cpp for a
    what-if card or an engine without llama-fit-params; ``(choice, None)`` or ``(None, why)``."""
    from ..runner.fit_params import fit_choice_for

    s: Any = session
    engine = None if s.fit_needs_port else engine_from_args(args, list_devices=False)
    inputs, _why = s.speed_inputs()
    return fit_choice_for(
        engine,
        model_path,
        s.planned_model(),
        s.config,
        s.gpus,
        s.host,
        inputs,
        goal,  # type: ignore[arg-type]
        split=s.split,
        n_threads=min(2, s.threads()),
    )


def _dry_run(path: object, best: Candidate) -> str:
    """llama.cpp's dry run of the chosen configuration, in one line."""
    from ..core.units import MiB
    from ..runner.dryrun import DryRunError, dry_run

    try:
        v = dry_run(path, best.config)  # type: ignore[arg-type]
    except DryRunError as exc:
        return f"refused the chosen configuration ({exc.kind}): {exc}"
    kv = sum(c.size_mib for c in v.kv_caches)
    planned = sum(c.kv_bytes for c in best.plan.kv_caches if c.kind != "recurrent") / MiB
    return f"llama.cpp accepts it; KV {kv:.2f} MiB (planned {planned:.2f} MiB), n_ctx {v.n_ctx}"


def _measure(path: object, n_threads: int, record_anyway: bool = False):
    """A callable that benches one configuration in the runner child at the top of its context,
    measuring the other load (:class:`~kvtuner.core.monitor.measurement.RunRecorder`: a busy load
    is shown but does not calibrate unless ``record_anyway``)."""
    from functools import partial

    from ..core.monitor.measurement import RunRecorder
    from ..core.plan.llama_constants import pad_ctx
    from ..core.speed.measurement import Measurement
    from ..core.tune.confirm import CONFIRM_GEN_TOKENS, CONFIRM_PROMPT_TOKENS, confirm_depth
    from ..runner.bench import BenchError, record_event, run_bench

    def measure(config: PlanConfig) -> Measurement:
        n_ctx = pad_ctx(config.n_ctx)
        depth = confirm_depth(n_ctx)
        if sys.stderr.isatty():
            print(f"kvtuner: real load: bench at depth {depth} ...", file=sys.stderr)
        recorder = RunRecorder(
            n_prompt=CONFIRM_PROMPT_TOKENS,
            n_gen=CONFIRM_GEN_TOKENS,
            n_depth=depth,
            model_path=str(path),
            config=config,
            engine="embedded",
            record_anyway=record_anyway,
            what="this real load",
        ).start()
        try:
            run_bench(
                path,  # type: ignore[arg-type]
                config,
                n_prompt=CONFIRM_PROMPT_TOKENS,
                n_gen=CONFIRM_GEN_TOKENS,
                n_depth=depth,
                repetitions=1,
                n_threads=n_threads,
                timeout_s=3600.0,
                idle_timeout_s=3600.0,
                on_event=partial(record_event, recorder),
            )
        except BenchError as exc:
            raise UserError(f"the confirming load failed ({exc.kind}): {exc}") from None
        measured = recorder.finish()  # the bench child was waited for: its CPU time is this process's
        if not measured.keep.calibrate:
            print(f"kvtuner: {measured.keep.reason}", file=sys.stderr)
        return measured

    return measure


def _load_line(l: RealLoad) -> str:
    m = l.measured
    de = f"{l.decode_error:+.1%}" if l.decode_error is not None else "-"
    pe = f"{l.prefill_error:+.1%}" if l.prefill_error is not None else "-"
    return (
        f"real load ({_short(l.config)}) at depth {m.n_depth}: decode predicted {l.predicted_decode_tok_s:.2f}, "
        f"measured {m.decode_tok_s or 0:.2f} tok/s ({de}); prefill predicted {l.predicted_prefill_tok_s:.1f}, "
        f"measured {m.prefill_tok_s or 0:.1f} tok/s ({pe})"
    )


def _print_load(l: RealLoad) -> None:
    print("kvtuner: " + _load_line(l), file=sys.stderr)


def _short(cfg: PlanConfig) -> str:
    ngl = "all" if cfg.n_gpu_layers < 0 else str(cfg.n_gpu_layers)
    kv = "all" if cfg.kv_gpu_layers is None else str(cfg.kv_gpu_layers)
    off = (f", FFN of {cfg.n_cpu_ffn} layers on CPU (--n-cpu-ffn)" if cfg.n_cpu_ffn else "") + (
        f", experts of {cfg.n_cpu_moe} layers on CPU (--n-cpu-moe)" if cfg.n_cpu_moe else ""
    )
    return (
        f"ctx {cfg.n_ctx}, K {cfg.type_k} / V {cfg.type_v}, flash attn {cfg.flash_attn}, ngl {ngl}, "
        f"KV layers on GPU {kv}, ubatch {cfg.n_ubatch}{off}"
    )


def _where(c: Candidate) -> str:
    from ..core.units import fmt_bytes

    p = c.plan
    parts = []
    for d in p.devices:
        cap = f" of {fmt_bytes(d.capacity_bytes)}" if d.capacity_bytes else ""
        parts.append(f"{d.backend_device} {fmt_bytes(d.total_bytes)}{cap}")
    return ", ".join(parts)


def _speed(c: Candidate) -> str:
    pre = (
        f", prefill {c.prefill_tok_s:.1f} tok/s ({c.prefill_tokens}-token prompt)"
        if c.prefill_tok_s is not None and math.isfinite(c.prefill_tok_s)
        else ""
    )
    return f"{c.decode_tok_s:.2f} tok/s decode at the full {c.plan.n_ctx_seq}-token context{pre}"


def fit_line(fit: FitChoice, best: Candidate | None) -> str:
    """llama.cpp's --fit choice in one row beside the tune's best."""
    how = "llama-fit-params" if fit.method == "llama-fit-params" else "kvtuner's port of common/fit.cpp"
    if fit.decode_tok_s is not None:
        speed = f"{fit.decode_tok_s:.2f} tok/s decode at the full context"
        if fit.prefill_tok_s is not None:
            speed += f", prefill {fit.prefill_tok_s:.1f} tok/s"
        if best is not None and fit.decode_tok_s:
            speed += f"; the tuned one is {best.decode_tok_s / fit.decode_tok_s:.1f}x that"
    else:
        speed = "not predicted"
    tail = "" if fit.fits is None or fit.fits else " (over a device's capacity less the margin in kvtuner's plan)"
    return f"--fit:     llama.cpp's --fit chooses {fit.flags} ({how}, {fit.source}): {speed}{tail}"


def explain(result: TuneResult, fit: FitChoice | None = None, fit_error: str | None = None) -> list[str]:
    """The result in sentences: chosen and why, runner-up and what it trades, llama.cpp's --fit
    (its own choice when ``fit`` is given, else kvtuner's equivalent)."""
    from ..core.tune import offload_note
    from ..core.units import fmt_bytes

    lines = []
    b = result.best
    g = result.goal
    goal = (
        f"context {g.n_ctx} at the best speed"
        if g.kind == "ctx"
        else f"at least {g.n_ctx_min} tokens at the best speed"
        if g.kind == "ctx_min"
        else f"the longest context at >= {g.min_tok_s:g} tok/s"
    )
    lines.append(
        f"goal: {goal}; KV no worse than {g.kv_quality}; {result.candidates_evaluated} configurations planned "
        f"in {result.elapsed_s * 1000:.0f} ms"
    )
    if b is None:
        lines += [f"nothing fits: {n}" for n in result.notes] or ["nothing fits"]
        return lines
    p = b.plan
    kv_where = (
        "all KV in VRAM"
        if p.gpus and p.kv_gpu_layers == p.n_gpu_repeating and p.n_gpu_repeating
        else f"KV of {p.kv_gpu_layers} of {p.model.n_layer} layers in VRAM"
        if p.gpus
        else "CPU only"
    )
    lines.append(f"chosen:    {_short(b.config)}")
    lines.append(
        f"           {_speed(b)}; {p.n_gpu_repeating}/{p.model.n_layer} layers on the GPU, {kv_where}; {_where(b)}"
    )
    why = "the fastest predicted decode at the full context among the configurations that fit"
    if b.measured_decode_tok_s is not None:
        why += f"; measured {b.measured_decode_tok_s:.2f} tok/s decode near the top of the context"
    lines.append(f"why:       {why}")
    note = offload_note(b)
    if note:
        lines.append(f"trade:     {note}")
    r = result.runner_up
    if r is not None:
        trade = []
        if (r.config.type_k, r.config.type_v) != (b.config.type_k, b.config.type_v):
            trade.append(f"K {r.config.type_k} / V {r.config.type_v} instead of {b.config.type_k}/{b.config.type_v}")
        if r.config.flash_attn != b.config.flash_attn:
            trade.append(f"flash attention {r.config.flash_attn}")
        if r.plan.kv_gpu_layers != p.kv_gpu_layers:
            trade.append(f"KV of {r.plan.kv_gpu_layers} layers in VRAM")
        if r.plan.n_gpu_repeating != p.n_gpu_repeating:
            trade.append(f"{r.plan.n_gpu_repeating} layers on the GPU")
        if r.config.n_ubatch != b.config.n_ubatch:
            trade.append(f"ubatch {r.config.n_ubatch}")
        if r.config.n_cpu_ffn != b.config.n_cpu_ffn:
            trade.append(f"FFN of {r.config.n_cpu_ffn} layers on CPU")
        if r.config.n_cpu_moe != b.config.n_cpu_moe:
            trade.append(f"experts of {r.config.n_cpu_moe} layers on CPU")
        dv = r.decode_tok_s / b.decode_tok_s - 1 if b.decode_tok_s else 0.0
        lines.append(f"runner-up: {_short(r.config)}")
        lines.append(f"           {_speed(r)} ({dv:+.0%}); trades: {', '.join(trade) or 'placement'}")
    f = result.fit_equivalent
    if fit is not None:
        lines.append(fit_line(fit, b))
        if fit.note:
            lines.append(f"           {fit.note}")
    elif fit_error:
        lines.append(f"--fit:     {fit_error}")
    elif f is not None:
        dv = b.decode_tok_s / f.decode_tok_s if f.decode_tok_s else float("inf")
        lines.append(
            f"--fit:     llama.cpp's --fit keeps K {f.config.type_k} / V {f.config.type_v}, flash attention "
            f"{f.config.flash_attn}, and sets -ngl {'all' if f.config.n_gpu_layers < 0 else f.config.n_gpu_layers}: "
            f"{_speed(f)}; the tuned one is {dv:.1f}x that"
        )
    else:
        lines.append("--fit:     llama.cpp's --fit finds nothing that fits with the configured KV types")
    for n in result.notes:
        lines.append(f"note:      {n}")
    if p.gpus:
        lines.append(
            f"memory:    every GPU within capacity less {fmt_bytes(g.vram_margin_bytes)}, host within "
            f"{1 - g.ram_headroom_fraction:.0%} of available RAM"
        )
    return lines
