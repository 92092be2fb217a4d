"""``kvtuner gpus`` (the GPU catalogue, and the detected cards with the entry each matched) and
``kvtuner probe`` (time llama.cpp's CPU kernels on this machine now, and keep the result)."""

from __future__ import annotations

import argparse
import sys

from .args import UserError, add_model_arg, add_record_anyway_arg, add_threads_arg, emit_json, load_model


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``gpus`` and ``probe``."""
    g = sub.add_parser(
        "gpus",
        help="list the GPU catalogue that --gpu NAME plans for (headless)",
        description="The named GPUs kvtuner knows: memory, bandwidth, tensor throughput and PCIe link "
        "from vendor specifications, and the detected GPUs with the entry each one matched.",
    )
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.set_defaults(func=cmd_gpus)
    p = sub.add_parser(
        "probe",
        help="time llama.cpp's CPU kernels on this machine (headless, about 20 s)",
        description="Run tiny zero-weight models through llama.cpp in a child process to measure this "
        "machine's CPU rates per weight type (decode bytes/s, prefill FLOP/s), its flash-attention cost, "
        "for a MoE model the decode rate of its expert matmuls (MUL_MAT_ID) at its own expert shape, and its "
        "fixed costs per layer and token; kept for a week and used by every speed prediction.",
    )
    add_model_arg(p)
    add_threads_arg(p)
    p.add_argument(
        "--types",
        default=None,
        metavar="T,T",
        help="weight types to time (default: those of MODEL), e.g. Q4_K,Q6_K,Q8_0",
    )
    p.add_argument(
        "--attn",
        default=None,
        metavar="H/K/D,...",
        help="attention shapes to time, query heads/KV heads/head size, with f16 K/V or, after @, "
        "another K/V pair: 32/8/128@q8_0, 32/8/128@q8_0+f16 (K+V); an MLA attention adds its "
        "kv_lora_rank: 16/1/576/512 (default: those of MODEL, or 32/8/128 with --types)",
    )
    add_record_anyway_arg(p, "the probe")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_probe)


def cmd_gpus(args: argparse.Namespace) -> int:
    """``kvtuner gpus``."""
    from ..core.hardware.gpu_catalogue import GPU_CATALOGUE
    from .args import detect_gpus

    detected = detect_gpus()
    if args.json:
        emit_json(
            {
                "catalogue": [
                    {
                        "name": g.name,
                        "vram_bytes": g.vram_bytes,
                        "mem_bandwidth_bytes_s": g.mem_bandwidth_bytes_s,
                        "fp16_tensor_flop_s": g.fp16_tensor_flop_s,
                        "int8_op_s": g.int8_op_s,
                        "fp32_flop_s": g.fp32_flop_s,
                        "pcie_gen": g.pcie_gen,
                        "pcie_lanes": g.pcie_lanes,
                        "arch": g.arch,
                        "nvml_names": list(g.nvml_names),
                        "source": g.source,
                    }
                    for g in GPU_CATALOGUE.values()
                ],
                "detected": [
                    {
                        "device": d.device,
                        "backend": d.backend,
                        "backend_device": d.backend_device,
                        "name": d.name,
                        "total_bytes": d.total_bytes,
                        "mem_bandwidth_bytes_s": d.mem_bandwidth_bytes_s,
                        "catalogue": d.catalogue,
                        "source": d.source,
                    }
                    for d in detected
                ],
            }
        )
        return 0
    width = max(18, *(len(g.name) + 1 for g in GPU_CATALOGUE.values()))
    print(f"{'GPU':<{width}}{'memory':>8}{'GB/s':>7}{'FP16 TF':>9}{'INT8 TOPS':>11}{'FP32 TF':>9}  PCIe")
    for g in GPU_CATALOGUE.values():
        print(
            f"{g.name:<{width}}{g.vram_bytes / 2**30:>6.0f} G{g.mem_bandwidth_bytes_s / 1e9:>7.0f}"
            f"{g.fp16_tensor_flop_s / 1e12:>9.1f}{g.int8_op_s / 1e12:>11.1f}{g.fp32_flop_s / 1e12:>9.1f}"
            f"  {g.pcie_gen}.0 x{g.pcie_lanes}"
        )
    print("\ntensor rates dense (no sparsity), FP16 with FP16 accumulate; sources: kvtuner gpus --json")
    if detected:
        for d in detected:
            # detection matched each card to its catalogue entry (NVML names, sysfs ids, Apple chips)
            print(
                f"detected {d.backend_device}: {d.name} ({d.source or d.backend}) -> "
                f"{d.catalogue or 'not in the catalogue (rates of the nearest card)'}"
            )
    else:
        print("no GPU detected: plan for a card with --gpu NAME, or a generic one with --gpu-mem SIZE")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """``kvtuner probe``."""
    from ..core.hardware.host import physical_cores
    from ..core.session import Session
    from ..core.speed.calibration import CalibrationError
    from ..core.speed.cpu_probe import PROBE_TYPES, ProbeError, attention_model, probe_expert_needs, probe_needs
    from ..runner.probe import run_cpu_probe

    n = args.threads or physical_cores()
    if args.types:
        types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
        bad = [t for t in types if t not in PROBE_TYPES]
        if bad:
            raise UserError(f"--types: cannot probe {', '.join(bad)}: probe types are {', '.join(PROBE_TYPES)}")
        session = Session(measure_host_bandwidth=False, n_threads=n)
        dims: list[str] = ["32/8/128"]
        experts: list[str] = []
    else:
        model = load_model(args.model)
        session = Session(model=model, measure_host_bandwidth=False, n_threads=n)
        t_needed, d_needed = probe_needs(model)
        types, dims = list(t_needed), list(d_needed) or ["32/8/128"]
        experts = list(probe_expert_needs(model))
    if args.attn:
        dims = [x.strip() for x in args.attn.split(",") if x.strip()]
        for d in dims:
            try:
                attention_model(d)
            except ProbeError as exc:
                raise UserError(f"--attn: {exc}") from None
    if not args.json:
        print(
            f"kvtuner: timing llama.cpp's CPU kernels for {', '.join([*types, *(f'experts {e}' for e in experts)])} at {n} thread{'s' if n != 1 else ''} ...",
            file=sys.stderr,
        )
    try:
        rates = run_cpu_probe(
            types,
            n,
            attn_shapes=dims,
            expert_keys=experts,
            on_progress=None
            if args.json
            else lambda k, total, key, t: print(f"  kernel {k} of {total} ({key}), {t:.0f} s", file=sys.stderr),
            stop_when_busy=not args.record_anyway,
        )
        session.set_cpu_rates(rates, record_anyway=args.record_anyway)
    except (ProbeError, CalibrationError) as exc:
        raise UserError(str(exc)) from None
    if args.json:
        emit_json(rates.to_dict())
        return 0
    width = max((len(t) for t in rates.decode_bytes_s), default=6)
    for t in sorted(rates.decode_bytes_s):
        print(
            f"{t:<{width}} decode {rates.decode_bytes_s[t] / 1e9:6.2f} GB/s   prefill {rates.prefill_flop_s[t] / 1e9:7.1f} GFLOP/s "
            f"(half of it at a {rates.half_batch.get(t, 0):.0f}-token batch)"
        )
    for d in sorted(rates.attn_decode_s):
        print(
            f"attention {d} (query heads/KV heads/head size): {rates.attn_decode_s[d] * 1e9:.1f} ns per head and cell in decode, "
            f"{rates.attn_prefill_s.get(d, 0) * 1e9:.2f} ns per token, head and cell in prefill"
        )
    for e in sorted(rates.expert_decode_bytes_s):
        print(
            f"experts {e} (width/expert FFN/experts/per token@types): decode {rates.expert_decode_bytes_s[e] / 1e9:.2f} GB/s "
            "of the selected experts"
        )
    print(
        f"per layer {rates.layer_s * 1e6:.1f} us (prefill {rates.layer_prefill_s * 1e6:.1f} us), per token "
        f"{rates.token_s * 1e3:.2f} ms (load average {rates.load_avg:.2f})"
    )
    return 0
