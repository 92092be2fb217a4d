"""``kvtuner monitor [URL|PID]``: watch a llama-server (or Ollama) someone else started, beside
kvtuner's plan for its configuration (:mod:`kvtuner.runner.attach_monitor`)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .args import UserError


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``monitor``."""
    p = sub.add_parser(
        "monitor",
        help="watch a running llama-server or Ollama: live speed, context fill, memory, kvtuner's prediction",
        description="Attach to a llama-server (or Ollama) that is already running and print, about once a second, its "
        "live prefill and decode tokens/s, the tokens in each slot against its context, the requests "
        "processing and deferred, the process's RAM, swap and VRAM, and kvtuner's plan and speed "
        "prediction for the configuration its command line gives, with the live advice. Without URL or "
        "PID it attaches to the one server found on this machine (llama-server processes, "
        "127.0.0.1:8080 and :9931, Ollama on 127.0.0.1:11434). Watching asks each endpoint at most "
        "once a second.",
    )
    p.add_argument(
        "target",
        nargs="?",
        metavar="URL|PID",
        help="the server's URL (http://127.0.0.1:8080) or the PID of its llama-server process; "
        "default: the one found on this machine",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON Lines: an 'attached' object (configuration, plan), then one 'sample' object per poll",
    )
    p.add_argument(
        "--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: until interrupted)"
    )
    p.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between polls, 1 or more (default 1)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the server's --api-key (default: read from its command line when it is a local process)",
    )
    p.add_argument(
        "--router-model",
        default="",
        metavar="NAME",
        help="the model to watch on a llama-server router (sent as ?model=NAME)",
    )
    p.add_argument("--list", action="store_true", help="list the servers found on this machine and exit")
    p.set_defaults(func=cmd_monitor)


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / (1 << 20):.0f} MiB"


def _rate(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def sample_line(s: dict[str, Any]) -> str:
    """One text line for a sample."""
    clock = time.strftime("%H:%M:%S", time.localtime(s["time_unix_s"]))
    if s.get("models") is not None and s.get("state") is not None and "slots" not in s:  # Ollama
        if s["state"] != "ok":
            return f"{clock} {s['state']}: {'; '.join(s['problems'])}"
        parts = []
        for m in s["models"]:
            part = (
                f"{m['name']} ctx {m['context_length'] or '-'} size {_mib(m['size_bytes'])} "
                f"(VRAM {_mib(m['vram_bytes'])}, RAM {_mib(m['ram_bytes'])}) until {m['expires_at'] or '-'}"
            )
            planned = m.get("planned")
            if planned and "total_bytes" in planned:
                part += f"; kvtuner plans {_mib(planned['total_bytes'])} (KV {_mib(planned['kv_bytes'])})"
            parts.append(part)
        return f"{clock} ollama: " + ("; ".join(parts) if parts else "no model loaded")
    if s["state"] in ("gone", "error") and not s.get("slots"):
        return f"{clock} {s['state']}: {'; '.join(s['problems'])}"
    slots = s.get("slots") or []
    ctx = ", ".join(f"{sl['tokens']}/{sl['n_ctx']}" for sl in slots) or "-"
    busy = s.get("requests_processing")
    line = (
        f"{clock} {s['state']}  decode {_rate(s['decode_tok_s'])} tok/s  prefill {_rate(s['prefill_tok_s'])} tok/s"
        f"  slots {ctx}  busy {busy if busy is not None else '-'}"
        + (f" deferred {s['requests_deferred']}" if s.get("requests_deferred") is not None else "")
    )
    proc = s.get("process")
    if proc and proc.get("alive"):
        vram = ", ".join(f"GPU{k} {_mib(v)}" for k, v in proc["vram_bytes"].items()) or "-"
        line += f"  RSS {_mib(proc['rss_bytes'])} swap {_mib(proc['swap_bytes'])} VRAM {vram}"
    pred = s.get("predicted")
    if pred and pred.get("decode_tok_s_now") is not None:
        line += (
            f"  | predicted decode {pred['decode_tok_s_now']:.1f} tok/s now, "
            f"{pred['decode_tok_s_at_full_ctx']:.1f} at full context"
        )
    extra = [*s.get("problems", ()), *s.get("notes", ())]
    if extra:
        line += "\n  " + "\n  ".join(extra)
    return line


def cmd_monitor(args: argparse.Namespace) -> int:
    """``kvtuner monitor``: attach and print samples until ``--duration`` or Ctrl-C."""
    from ..runner.attach import AttachError, find_servers
    from ..runner.attach_monitor import Monitor, watch
    from .args import config_from_server_argv

    if args.interval < 1:
        raise UserError(
            f"--interval must be 1 second or more (watching must not load the server), not {args.interval:g}"
        )
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"--duration must be a positive number of seconds, not {args.duration:g}")
    if args.list:
        found = find_servers()
        if args.json:
            print(
                json.dumps(
                    {"servers": [{"kind": s.kind, "url": s.url, "pid": s.pid, "argv": list(s.argv)} for s in found]}
                )
            )
        else:
            print("\n".join(s.label for s in found) if found else "no running llama-server or Ollama found")
        return 0
    try:
        mon = Monitor.attach(
            args.target, api_key=args.api_key, router_model=args.router_model, parse_argv=config_from_server_argv
        )
    except AttachError as exc:
        raise UserError(str(exc)) from None
    state = {"header": False}

    def emit(sample: dict[str, Any]) -> None:
        if not state["header"] and (
            mon.kind == "ollama" or mon.config is not None or sample.get("state") == "ok" or mon.notes
        ):
            state["header"] = True
            h = mon.header()
            if args.json:
                print(json.dumps(h), flush=True)
            else:
                print(_header_text(h), flush=True)
        if args.json:
            print(json.dumps(sample), flush=True)
        else:
            print(sample_line(sample), flush=True)

    try:
        watch(mon, args.duration, args.interval, emit)
    except KeyboardInterrupt:
        return 0
    return 0


def _header_text(h: dict[str, Any]) -> str:
    lines = [f"attached to {h['kind']} {h['url']}" + (f" (pid {h['pid']})" if h.get("pid") else "")]
    if h.get("model_path"):
        lines.append(f"  model          {h['model_path']}")
    cfg = h.get("config")
    if cfg:
        from ..core.plan.config import PlanConfig
        from ..core.plan.fields import config_field

        config, default = PlanConfig.from_dict(cfg), PlanConfig()
        changed = [
            config_field(k).cli_text(getattr(config, k)) for k in cfg if getattr(config, k) != getattr(default, k)
        ]
        lines.append("  configuration  " + (" ".join(changed) or "kvtuner's defaults"))
    for r in h.get("resolved") or ():
        lines.append(f"  resolved       {r}")
    if h.get("not_understood"):
        lines.append("  not understood " + "; ".join(h["not_understood"]))
    plan = h.get("plan")
    if plan:
        devs = ", ".join(
            f"{d.get('backend_device') or d['device']} {d['total_bytes'] / (1 << 20):.0f} MiB" for d in plan["devices"]
        )
        lines.append(f"  kvtuner's plan {devs} (KV {plan['kv_bytes'] / (1 << 20):.0f} MiB)")
        sp = plan.get("speed")
        if sp:
            lines.append(
                f"  predicted      decode {sp['decode_tok_s']:.1f} tok/s empty, "
                f"{sp['decode_tok_s_at_full_ctx']:.1f} at full context; prefill {sp['prefill_tok_s']:.0f} tok/s"
            )
    for n in h.get("notes") or ():
        lines.append(f"  note           {n}")
    return "\n".join(lines)
