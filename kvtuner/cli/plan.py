"""``kvtuner plan`` and ``kvtuner inspect``: the session's assessment, printed or as JSON."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .args import (
    UserError,
    add_config_args,
    add_engine_arg,
    add_extras_args,
    add_hardware_args,
    add_model_arg,
    add_record_anyway_arg,
    add_threads_arg,
    add_vllm_args,
    add_workload_args,
    any_workload_flag,
    config_from_args,
    emit_json,
    engine_from_args,
    ensure_cpu_probe,
    extras_from_args,
    hardware_from_args,
    load_model,
    positive_int,
    rpc_endpoints,
    session_from_args,
    vllm_model_from_args,
    vllm_settings_from_args,
    vllm_weights_from_args,
    workload_from_args,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..core.model.profile import ModelProfile
    from ..core.plan.config import PlanConfig


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``plan`` and ``inspect``."""
    p = sub.add_parser(
        "plan",
        help="plan where every byte goes for a configuration (headless)",
        description="Plan weights, KV cache, compute and output buffers per device, as llama.cpp will allocate them.",
    )
    add_model_arg(p)
    add_engine_arg(p)
    add_config_args(p)
    add_extras_args(p)
    add_hardware_args(p)
    add_threads_arg(p, "to predict the speed for")
    add_record_anyway_arg(p, "the CPU probe this command starts")
    p.add_argument(
        "--verify",
        action="store_true",
        help="ask the engine's llama.cpp for the exact buffers without loading weights: the embedded one "
        "(dry run in a child process) or llama-server's own start-up memory breakdown (--engine)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/reference/plan-json.md)")
    p.add_argument(
        "--prompt",
        type=positive_int,
        default=512,
        metavar="N",
        help="prompt length of the predicted prefill in tokens (default 512; with experts in RAM a prompt "
        "longer than -ub shows what -ub changes)",
    )
    add_workload_args(p)
    t = p.add_argument_group("decision table (--table) and vLLM budget (--vllm)")
    t.add_argument(
        "--table",
        action="store_true",
        help="print the grid sequences x window x KV type -> fits / does not fit, roofline tok/s, for the card",
    )
    t.add_argument(
        "--table-seqs", default="1,2,4,8", metavar="LIST", help="sequence counts of the table (default 1,2,4,8)"
    )
    t.add_argument(
        "--table-windows",
        default="8192,16384,32768",
        metavar="LIST",
        help="per-sequence windows of the table in tokens (default 8192,16384,32768)",
    )
    t.add_argument(
        "--table-kv",
        default="f16,q8_0,fp8",
        metavar="LIST",
        help="KV types of the table: llama.cpp types and fp8 (vLLM; default f16,q8_0,fp8)",
    )
    t.add_argument(
        "--vllm", action="store_true", help="also plan vLLM's KV pool, blocks and maximum concurrency on the card"
    )
    add_vllm_args(p)
    p.set_defaults(func=cmd_plan)

    i = sub.add_parser("inspect", help="show what kvtuner reads from a GGUF model (headless)")
    add_model_arg(i)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_inspect)


def cmd_plan(args: argparse.Namespace) -> int:
    """``kvtuner plan``: one :class:`~kvtuner.core.session.Assessment`."""
    from ..core.plan.config import ConfigError
    from . import report

    if args.table:
        return cmd_table(args)
    model = load_model(args.model)
    config = config_from_args(args, model=model)
    session = session_from_args(args, model, config)
    extras = extras_from_args(args)
    if not extras.empty:
        # projector / draft / LoRA: counted in every plan, so the verdict and the advice see them
        session.extras = extras
        from ..core.plan.config import ConfigError as _ConfigError
        from ..core.plan.extras import check_files

        try:
            check_files(extras, model)
        except _ConfigError as exc:
            raise UserError(str(exc)) from None
        if args.verify and extras.draft:
            session.draft_exact = _verify_draft(args, model, config, extras)
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be 1 or more (leave it out for the physical cores), not {args.threads}")
        session.n_threads = args.threads
    if args.prompt < 1:
        raise UserError(f"--prompt must be 1 or more tokens, not {args.prompt}")
    session.prefill_tokens = args.prompt
    try:
        session.plan()  # a configuration llama.cpp would refuse fails here, before any dry run
        note = ensure_cpu_probe(session, args, quiet=args.json, default_mode="background")
        if note:
            print(note, file=sys.stderr)
        if args.verify:
            session.set_verified(
                verify(
                    model,
                    config,
                    engine_from_args(args),
                    split=session.split,
                    rpc=[e for e in rpc_endpoints(args) if "=" not in e],
                )
            )
        elif session.needs_structure_probe and not args.no_probe:
            session.set_structure(probe(model))
        assessment = session.assess()
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if assessment.speed is None and assessment.speed_error:
        print(f"kvtuner: no speed prediction: {assessment.speed_error}", file=sys.stderr)
    resolved = list(getattr(args, "resolved_notes", ()))
    extra_doc, extra_text = _workload_and_vllm(args, assessment.plan, config)
    extras_doc, extras_text = _extras(args, session, assessment, model)
    if args.json:
        doc = assessment.to_dict()
        doc["resolved"] = resolved  # llama-server defaults as resolved (--ctx 0, -np -1)
        doc.update(extra_doc)
        doc.update(extras_doc)
        emit_json(doc)
    else:
        text = report.plan_text(assessment)
        print("\n".join([*(f"resolved: {n}" for n in resolved), text, *extras_text, *extra_text]))
    return 0


def _extras(
    args: argparse.Namespace, session: object, assessment: object, model: ModelProfile
) -> tuple[dict, list[str]]:
    """The projector / draft / LoRA section (the plan's :class:`~kvtuner.core.plan.extras.ExtrasPlan`)
    as the ``extras`` JSON key and text lines; empty without ``--mmproj``, ``-md`` and ``--lora``.
    With ``--verify`` and a server engine the draft's figures are llama-server's second breakdown table."""
    from . import report

    xp = getattr(assessment.plan, "extras", None)
    if xp is None:
        return {}, []
    doc = xp.to_dict()
    speed = _extras_speed(session, assessment, xp)
    doc["speed"] = speed
    return {"extras": doc}, report.extras_text(assessment.plan, xp) + report.extras_speed_text(speed)


def _extras_speed(session: object, assessment: object, xp: object) -> dict:
    """Speculative decoding's tokens/s range and one image's encode time (``extras.speed``)."""
    from ..core.plan.extras import projector_flops, projector_header
    from ..core.speed.extras_speed import image_encode_s, speculative_speed
    from ..core.speed.speed_model import SpeedModelError, predict_speed

    out: dict = {"speculative": None, "image_encode_s": None, "why": []}
    main = assessment.speed
    if main is None:
        out["why"].append("no speed prediction for the model")
        return out
    if xp.draft_plan is not None:
        inputs, why = session.speed_inputs()
        try:
            draft = predict_speed(xp.draft_plan, inputs) if inputs is not None else None
        except SpeedModelError as exc:
            draft, why = None, str(exc)
        if draft is None:
            out["why"].append(f"no speed prediction for the draft: {why}")
        else:
            out["speculative"] = speculative_speed(
                main.decode_tok_s, main.prefill_tok_s, draft.decode_tok_s, n_draft=xp.config.draft_n_max
            ).to_dict()
    if xp.config.mmproj:
        flops = projector_flops(projector_header(xp.config.mmproj, assessment.plan.model.n_embd))
        if flops:
            out["image_encode_s"] = image_encode_s(flops, main.prefill_tok_s, 2.0 * assessment.plan.model.n_params)
            out["image_encode_assumption"] = (
                "the projector's operations (2 x patches per weight + attention) at the "
                "operations per second of the model's predicted prefill"
            )
    return out


def _verify_draft(args: argparse.Namespace, model: ModelProfile, config: PlanConfig, extras: object) -> object:
    """llama-server's figures for the draft (its fit step's second table), as ExactFigures."""
    from ..core.plan.config import ConfigError
    from ..runner.dryrun import DryRunError
    from ..runner.extras_verify import draft_exact_figures, verify_draft

    engine = engine_from_args(args)
    if getattr(engine, "kind", "") != "server":
        print(
            "kvtuner: the draft's figures come from llama-server's fit step: --engine server to verify them",
            file=sys.stderr,
        )
        return None
    try:
        return draft_exact_figures(verify_draft(engine, model.path, config, extras))
    except DryRunError as exc:
        raise UserError(f"llama-server could not measure the draft: {exc}") from None
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def _workload_and_vllm(args: argparse.Namespace, plan: object, config: PlanConfig) -> tuple[dict, list[str]]:
    """The workload section (worst / P95 / expected KV for llama.cpp and vLLM) and the vLLM budget,
    as JSON keys and text lines; empty without ``--avg-tokens``/``--p95-tokens``/``--shared-prefix``
    and ``--vllm``."""
    from . import report

    doc: dict = {}
    lines: list[str] = []
    if any_workload_flag(args):
        from ..core.plan.vllm import VllmError, VllmModel
        from ..core.plan.workload import workload_advice, workload_kv

        # the most one sequence may hold: --window, else what llama.cpp lets it reach (its stream's
        # n_ctx_seq; with --kv-unified the whole buffer, llama-server's per-slot n_ctx, ggml-org/llama.cpp#16736)
        window = args.window or (plan.n_ctx if config.kv_unified else plan.n_ctx_seq)  # type: ignore[attr-defined]
        w = workload_from_args(args, config.n_seq, window)
        per = plan.kv_bytes_per_token()  # type: ignore[attr-defined]
        ll = workload_kv(per, w, engine="llama.cpp", unified=config.kv_unified)
        from ..core.advice.workload import advise_unified, advise_workload

        items = advise_workload(ll, plan.n_ctx)  # type: ignore[attr-defined]
        if not config.kv_unified:
            uni = workload_kv(per, w, engine="llama.cpp", unified=True)
            items += advise_unified(
                ll.worst_tokens, uni.p95_tokens if uni.p95_tokens is not None else uni.expected_tokens, per
            )
        doc["workload"] = {
            "n_seq": w.n_seq,
            "window_tokens": w.window_tokens,
            "avg_tokens": w.avg_tokens,
            "p95_tokens": w.p95_tokens,
            "shared_prefix_tokens": w.shared_prefix_tokens,
            "llama_cpp": ll.to_dict(),
            "advice": workload_advice(ll, plan.n_ctx),  # type: ignore[attr-defined]
            "advice_items": [a.to_dict() for a in items],
        }
        try:
            vm = VllmModel.from_profile(plan.model)  # type: ignore[attr-defined]
            vl = workload_kv(
                vm.kv_bytes_per_token("fp8" if config.type_k != "f16" and config.type_v != "f16" else "auto"),
                w,
                engine="vllm",
            )
            doc["workload"]["vllm"] = vl.to_dict()
        except VllmError:
            vl = None
        lines += ["", report.workload_text(w, ll, vl, doc["workload"]["advice"])]
        from ..core.advice.advisor import fix_flags

        for a in items:
            lines.append(f"[{a.severity}] {a.id}: {a.message}\n    fix: {fix_flags(a.fix)}")
    if args.vllm:
        doc["vllm"], text = _vllm_plan(args, config)
        lines += ["", text]
    return doc, lines


def _vllm_plan(args: argparse.Namespace, config: PlanConfig) -> tuple[dict, str]:
    """vLLM's budget on the first GPU of the hardware flags."""
    from ..core.plan.vllm import VllmError, cuda_reported_total, plan_vllm
    from . import report

    model, _ = vllm_model_from_args(args, args.model)
    settings = vllm_settings_from_args(args, config)
    gpus, _host = hardware_from_args(args)
    if not gpus:
        raise UserError("--vllm needs a GPU: give --gpu NAME or --gpu-mem SIZE")
    try:
        vp = plan_vllm(
            model,
            settings,
            cuda_reported_total(gpus[0].total_bytes),  # type: ignore[arg-type]
            weights_bytes=vllm_weights_from_args(args, model),
            gpu_name=gpus[0].name,
        )
    except VllmError as exc:
        raise UserError(str(exc)) from None
    return vp.to_dict(), report.vllm_text(vp, gpus[0].name)


def _int_list(flag: str, text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UserError(f"{flag}: '{text}' is not a comma-separated list of whole numbers, e.g. 1,2,4") from None
    if not out or min(out) < 1:
        raise UserError(f"{flag}: give positive whole numbers, e.g. 1,2,4")
    return out


def cmd_table(args: argparse.Namespace) -> int:
    """``kvtuner plan --table``: the decision table for the model and the card."""
    from ..core.plan.decision_table import TableError, decision_table
    from ..core.plan.vllm import VllmModel
    from . import report

    seqs = _int_list("--table-seqs", args.table_seqs)
    windows = _int_list("--table-windows", args.table_windows)
    kv_types = [x for x in args.table_kv.replace(" ", "").split(",") if x]
    model, _ = vllm_model_from_args(args, args.model)
    assert isinstance(model, VllmModel)
    if args.hf_config:
        weights = vllm_weights_from_args(args, model) or model.weights_bytes
    else:
        weights = load_model(args.model).weights_bytes
    gpus, _host = hardware_from_args(args)
    if not gpus:
        raise UserError("--table needs a card: give --gpu NAME or --gpu-mem SIZE")
    gpu = gpus[0]
    try:
        cells = decision_table(
            model,
            gpu.total_bytes,
            weights_bytes=weights,
            seqs=seqs,
            windows=windows,
            kv_types=kv_types,
            bandwidth_bytes_s=gpu.mem_bandwidth_bytes_s,
        )
    except TableError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        emit_json(
            {
                "model": model.name,
                "gpu": gpu.name,
                "gpu_bytes": gpu.total_bytes,
                "weights_bytes": weights,
                "cells": [c.to_dict() for c in cells],
            }
        )
    else:
        print(report.table_text(model.name, gpu.name, gpu.total_bytes, weights, cells))
    return 0


def verify(
    model: ModelProfile,
    config: PlanConfig,
    engine: object | None = None,
    *,
    split: object = None,
    rpc: list[str] | None = None,
) -> object:
    """What ``engine`` (None: the embedded one) reports for ``config``
    (:func:`kvtuner.runner.server_verify.verify_with_engine`; nothing is loaded); a llama-server
    gets the ``-sm``/``-ts``/``-mg`` of ``split`` and the real (not what-if) ``--rpc`` servers.

    Raises:
        UserError: llama.cpp refused the configuration, or the runner is missing.
    """
    try:
        from ..runner.dryrun import DryRunError
        from ..runner.engines import embedded_engine
        from ..runner.server_verify import verify_with_engine
    except ImportError as exc:  # pragma: no cover - broken install
        raise UserError(f"--verify needs the runner: {exc}") from None
    eng = engine if engine is not None else embedded_engine()
    try:
        return verify_with_engine(
            eng,
            model.path,
            config,
            timeout_s=VERIFY_TIMEOUT_S,  # type: ignore[arg-type]
            split=split,
            rpc=rpc or (),
        )
    except DryRunError as exc:
        who = getattr(eng, "label", "llama.cpp")
        raise UserError(f"{who} refused this configuration ({exc.kind}): {exc}") from None


#: Seconds ``plan --verify`` waits for llama.cpp's figures.
VERIFY_TIMEOUT_S = 120.0


def probe(model: ModelProfile) -> object:
    """The model's layer structure read from the installed llama.cpp (a dry run in a child
    process, once per model and llama.cpp build: the session remembers it); None when
    llama.cpp is not installed or cannot load the model (the plan then stays approximate)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from ..runner.dryrun import DryRunError, probe_structure

    if sys.stderr.isatty():
        print(
            f"kvtuner: reading {model.architecture}'s layer structure from llama.cpp (once per model) ...",
            file=sys.stderr,
        )
    try:
        return probe_structure(model.path, model.structure)
    except DryRunError as exc:
        print(f"kvtuner: llama.cpp could not be asked for the layer structure ({exc.kind}): {exc}", file=sys.stderr)
        return None


def cmd_inspect(args: argparse.Namespace) -> int:
    """``kvtuner inspect``: the model profile."""
    from . import report

    model = load_model(args.model)
    if args.json:
        emit_json(model.to_dict())
    else:
        print(report.model_text(model))
    return 0
