"""llama.cpp's own ``--fit`` choice, beside kvtuner's tune.

llama-server (and llama-cli) run ``common_fit_params`` (common/fit.cpp) at start-up when
``--fit on`` (the default) and the user left ``-ngl``, ``-ts``, ``-ot`` / ``--n-cpu-moe`` /
``--cpu-moe`` / ``--n-cpu-ffn`` unset: it lowers the context (only when ``-c`` was left to the
model, never below ``--fit-ctx``, default 4096) and then the layers on each device until every
device keeps ``--fit-target`` (default 1024 MiB) free. ``llama-fit-params`` prints what it chose
as ``-c N -ngl N [-ts A,B,...] [-ot "PATTERN=BUFT,..."]`` (tools/fit-params/fit-params.cpp).

Two methods give a :class:`FitChoice`:

- ``llama-fit-params``: the engine's binary, run on this machine
  (:func:`kvtuner.runner.fit_params.run_fit_params`); it sees only the devices this machine has;
- ``port``: :func:`port_fit_choice`, the algorithm of common/fit.cpp ``common_params_fit_impl``
  (llama.cpp b11434) run on kvtuner's own memory plan, for what-if cards llama.cpp cannot see.

Pure Python: no Qt, no llama_cpp, no processes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..hardware.specs import GpuSpec, HostSpec
from ..model.profile import ModelProfile
from ..plan.build_rules import VENDORED, BuildRules
from ..plan.config import ALL_LAYERS, ConfigError, PlanConfig
from ..plan.llama_constants import round_down_ctx
from ..plan.memory_plan import MemoryPlan, order_devices, plan_memory
from ..plan.placement import DeviceSplit
from ..plan.verdict import FIT_TARGET_MIB, FitMargins, fit_verdict
from ..units import MiB

#: ``--fit-ctx`` default: the smallest context ``--fit`` reduces to (common/common.h ``fit_params_min_ctx``).
FIT_MIN_CTX = 4096

METHOD_BINARY = "llama-fit-params"
METHOD_PORT = "port"

#: The printed choice (tools/fit-params/fit-params.cpp ``printf("-c %u -ngl %d" ...)``).
_LINE_RE = re.compile(r'^-c (?P<ctx>\d+) -ngl (?P<ngl>-?\d+)(?: -ts (?P<ts>[\d,]+))?(?: -ot "(?P<ot>[^"]*)")?\s*$')

# common/fit.cpp ``common_layer_fraction_t``: which part of a layer overflows to another buffer
_ATTN, _UP, _GATE, _MOE = "attn", "up", "gate", "moe"
#: All MoE expert tensors (common/fit.cpp ``pattern_moe_all``).
MOE_ALL_PATTERN = r"blk\.\d+\.ffn_(up|down|gate_up|gate)_(ch|)exps"


class FitChoiceError(ValueError):
    """``--fit`` chose nothing: it gives up (the user fixed the placement) or nothing fits;
    the message says why in one line."""


def overflow_pattern(il: int, fraction: str) -> str:
    """The tensor pattern common/fit.cpp ``get_overflow_pattern`` writes for layer ``il``: what of
    the layer leaves the device (``attn``: the FFN; ``up``: FFN but up; ``gate``: the down
    projection; ``moe``: the expert tensors)."""
    if fraction == _ATTN:
        return rf"blk\.{il}\.ffn_(gate|up|gate_up|down).*"
    if fraction == _UP:
        return rf"blk\.{il}\.ffn_(gate|gate_up|down).*"
    if fraction == _GATE:
        return rf"blk\.{il}\.ffn_down.*"
    return rf"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps"


@dataclass(frozen=True)
class FitChoice:
    """One ``--fit`` choice.

    Attributes:
        method: :data:`METHOD_BINARY` (llama-fit-params ran) or :data:`METHOD_PORT`.
        n_ctx: context in tokens (all sequences).
        n_gpu_layers: ``-ngl`` as printed; -1 is llama.cpp's ``auto`` (every layer, as ``all``).
        tensor_split: ``-ts`` in layers per device (empty with one device).
        overrides: ``-ot`` entries ``PATTERN=BUFT``, in order.
        source: the engine or the what-if hardware the choice is for (one line).
        note: what was approximated or left out (one line, may be empty).
        decode_tok_s, prefill_tok_s: kvtuner's prediction for this configuration (None: not predicted).
        fits: kvtuner's plan of it keeps every device within its capacity less the margin.
    """

    method: str
    n_ctx: int
    n_gpu_layers: int
    tensor_split: tuple[int, ...] = ()
    overrides: tuple[str, ...] = ()
    source: str = ""
    note: str = ""
    decode_tok_s: float | None = None
    prefill_tok_s: float | None = None
    fits: bool | None = None

    @property
    def flags(self) -> str:
        """The choice as llama-fit-params prints it: ``-c 8192 -ngl 20 -ts 12,9 -ot "..."``."""
        out = f"-c {self.n_ctx} -ngl {self.n_gpu_layers}"
        if len(self.tensor_split) > 1:
            out += " -ts " + ",".join(str(x) for x in self.tensor_split)
        if self.overrides:
            out += ' -ot "' + ",".join(self.overrides) + '"'
        return out

    def config(self, base: PlanConfig, n_devices: int = 0) -> tuple[PlanConfig, DeviceSplit | None]:
        """``base`` with this choice applied: ``(config, split)`` for
        :func:`~kvtuner.core.plan.memory_plan.plan_memory` (``-ngl -1`` is every layer; ``-ts``
        padded with zeros to ``n_devices``, as llama.cpp reads a short list).

        Raises:
            ConfigError: an override kvtuner cannot plan (a buffer other than CPU / CUDA<n>).
        """
        cfg = base.with_(
            n_ctx=self.n_ctx,
            n_gpu_layers=ALL_LAYERS if self.n_gpu_layers < 0 else self.n_gpu_layers,
            kv_gpu_layers=None,
            tensor_overrides=tuple(self.overrides),
        )
        ts = [float(x) for x in self.tensor_split]
        ts += [0.0] * (n_devices - len(ts))
        split = DeviceSplit(tensor_split=tuple(ts)) if any(ts) and n_devices > 1 else None
        return cfg, split

    def to_dict(self) -> dict[str, Any]:
        """``{flags, method, n_ctx, n_gpu_layers, tensor_split, overrides, source, note, fits,
        predicted: {decode_tok_s, prefill_tok_s}}`` (the ``fit_choice`` of ``kvtuner tune --json``)."""
        return {
            "flags": self.flags,
            "method": self.method,
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": list(self.tensor_split),
            "overrides": list(self.overrides),
            "source": self.source,
            "note": self.note,
            "fits": self.fits,
            "predicted": {"decode_tok_s": self.decode_tok_s, "prefill_tok_s": self.prefill_tok_s},
        }


def parse_fit_line(text: str) -> tuple[int, int, tuple[int, ...], tuple[str, ...]]:
    """``(n_ctx, n_gpu_layers, tensor_split, overrides)`` from llama-fit-params' stdout (its last
    line that starts with ``-c``; tools/fit-params/fit-params.cpp).

    Raises:
        FitChoiceError: no such line.
    """
    for line in reversed(text.splitlines()):
        m = _LINE_RE.match(line.strip())
        if m:
            ts = tuple(int(x) for x in m["ts"].split(",")) if m["ts"] else ()
            ot = tuple(x for x in m["ot"].split(",") if x) if m["ot"] else ()
            return int(m["ctx"]), int(m["ngl"]), ts, ot
    raise FitChoiceError("llama-fit-params printed no '-c N -ngl N' line")


@dataclass(frozen=True)
class FitRequest:
    """What is asked of ``--fit``: the tune goal in llama.cpp's terms.

    Attributes:
        n_ctx: ``-c``; 0 leaves the context to the model (then ``--fit`` may lower it).
        n_ctx_min: ``--fit-ctx`` (used only when ``n_ctx`` is 0).
        target_mib: ``--fit-target`` per device, MiB.
    """

    n_ctx: int = 0
    n_ctx_min: int = FIT_MIN_CTX
    target_mib: int = FIT_TARGET_MIB

    @classmethod
    def for_goal(cls, goal: Any, target_mib: int = FIT_TARGET_MIB) -> FitRequest:
        """The request for a :class:`~kvtuner.core.tune.TuneGoal`: ``--ctx N`` is ``-c N``;
        ``--ctx-min N`` is the model's context with ``--fit-ctx N``; ``--min-tok-s`` the model's
        context with the default ``--fit-ctx`` (``--fit`` knows no speed goal)."""
        if goal.n_ctx is not None:
            return cls(n_ctx=int(goal.n_ctx), target_mib=target_mib)
        if goal.n_ctx_min is not None:
            return cls(n_ctx=0, n_ctx_min=int(goal.n_ctx_min), target_mib=target_mib)
        return cls(n_ctx=0, target_mib=target_mib)


def fit_blockers(config: PlanConfig, split: DeviceSplit | None = None) -> list[str]:
    """The settings of ``config`` that make ``--fit`` give up (common/fit.cpp
    ``common_params_fit_impl``: "n_gpu_layers already set by user", "tensor_split already set by
    user", "tensor_buft_overrides already set by user"; ``--n-cpu-moe``, ``--cpu-moe`` and
    ``--n-cpu-ffn`` are tensor overrides, common/arg.cpp), as the flags the user wrote."""
    out = []
    if config.n_gpu_layers != ALL_LAYERS:
        out.append(f"-ngl {config.n_gpu_layers}")
    if split is not None and split.tensor_split is not None:
        out.append("-ts " + ",".join(f"{x:g}" for x in split.tensor_split))
    if config.tensor_overrides:
        out.append("-ot")
    if config.n_cpu_moe:
        out.append(f"--n-cpu-moe {config.n_cpu_moe}")
    if config.cpu_moe:
        out.append("--cpu-moe")
    if config.n_cpu_ffn:
        out.append(f"--n-cpu-ffn {config.n_cpu_ffn}")
    if config.kv_gpu_layers is not None:
        out.append("-ot (KV split)" if config.kv_gpu_layers else "-nkvo")
    return out


def fit_params_args(model_path: str, base: PlanConfig, request: FitRequest) -> tuple[list[str], list[str]]:
    """llama-fit-params' arguments for ``base`` and ``request`` (after the binary), and one note per
    setting it cannot be given.

    Only what ``--fit`` may not change is passed: the KV types, flash attention, sequences and
    batch sizes, ``--swa-full``; ``-kvu`` is a server/batched/bench flag that llama-fit-params
    refuses (common/arg.cpp ``set_examples``), so a unified cache is fitted per sequence.
    """
    notes = []
    argv = ["-m", model_path, "--fit", "on", "-fitt", str(request.target_mib)]
    if request.n_ctx:
        argv += ["-c", str(request.n_ctx)]
    else:
        argv += ["-fitc", str(request.n_ctx_min)]
    argv += [
        "-fa",
        base.flash_attn,
        "-ctk",
        base.type_k,
        "-ctv",
        base.type_v,
        "-np",
        str(base.n_seq),
        "-b",
        str(base.n_batch),
        "-ub",
        str(base.n_ubatch),
    ]
    if base.swa_full:
        argv.append("--swa-full")
    if base.kv_unified and base.n_seq > 1:
        notes.append("llama-fit-params refuses -kvu: fitted with one KV stream per sequence")
    return argv, notes


# ------------------------------------------------------------------------------------------
# the port of common/fit.cpp


@dataclass
class _Ngl:
    """common/fit.cpp ``ngl_t``: layers of one device, of which ``n_part`` are partial (their
    experts, or part of the first one's FFN, elsewhere)."""

    n_layer: int = 0
    n_part: int = 0
    overflow: str = _MOE

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


def _u32(x: int) -> int:
    """``x`` as the ``uint32_t`` C++ assigns it to (a negative step wraps, then is clamped)."""
    return x % (1 << 32)


def _copy(v: list[_Ngl]) -> list[_Ngl]:
    return [replace(x) for x in v]


def port_fit_choice(
    model: ModelProfile,
    base: PlanConfig,
    gpus: Sequence[GpuSpec],
    host: HostSpec | None,
    request: FitRequest = FitRequest(),
    *,
    plan: Callable[[PlanConfig, DeviceSplit | None], MemoryPlan] | None = None,
) -> FitChoice:
    """What llama.cpp's ``--fit`` would choose, computed the way common/fit.cpp
    ``common_params_fit_impl`` (b11434) does, with kvtuner's memory plan in place of llama.cpp's
    no-alloc measurement (``common_get_device_memory_data``).

    Each llama.cpp measurement is one :func:`~kvtuner.core.plan.memory_plan.plan_memory`:
    a GPU's use is its planned total (weights, KV, compute, output and the CUDA context) against
    its capacity (its free memory when measured), so the target keeps ``target_mib`` free as
    ``--fit-target`` does; the host (CPU only) is its weights, KV, compute and output against its
    physical RAM (ggml-cpu.cpp ``ggml_backend_cpu_device_get_memory`` reports the total as free),
    less the weights in the ``CPU_REPACK`` buffer, which llama.cpp's measurement does not count.
    Steps: (1) nothing changes when every device keeps the margin; (2) a context left to the model
    is interpolated linearly between ``--fit-ctx`` and the training context to the memory left,
    rounded down to 256 per stream; (3) layers fill the devices back to front by false position,
    MoE models with their experts in RAM first; (4) for MoE, whole layers then replace expert-less
    ones front to back, with one partly offloaded layer (``ffn_*`` overflow) per device.

    Args:
        model, base, gpus, host: what is planned; ``base`` must leave ``-ngl``/``-ot``/MoE
            offload unset (:func:`fit_blockers`).
        request: context and margin (:class:`FitRequest`).
        plan: the planner (default :func:`plan_memory` of ``model`` on ``gpus``/``host``).

    Raises:
        FitChoiceError: ``--fit`` gives up (a blocker is set, or a CPU-only model does not fit
            by reducing the context), with llama.cpp's reason.
    """
    if plan is None:

        def plan(cfg: PlanConfig, split: DeviceSplit | None) -> MemoryPlan:
            return plan_memory(model, cfg, gpus, host, split=split)

    port = _FitPort(request, plan, model, base, gpus, host)
    done = port.step_defaults()
    if done is None:
        done = port.step_context()
    if done is not None:
        return done
    port.check_gives_up()
    moe = port.step_fill_back_to_front()
    if moe is None:
        return port.choice(*port.layout(port.ngl_pd, port.overflow))
    return port.step_moe_front_to_back(moe)


@dataclass
class _MoeFill:
    """The state of common/fit.cpp's MoE step: the layers per device, their measured use, the
    overflow buffer of each device's partial layer and the first device holding dense layers."""

    ngl_pd: list[_Ngl]
    mem: list[int]
    overflow: list[str]
    id_dense_start: int


class _FitPort:
    """The measurements and steps of :func:`port_fit_choice` (common/fit.cpp
    ``common_params_fit_impl``), one method per step."""

    def __init__(
        self,
        request: FitRequest,
        plan: Callable[[PlanConfig, DeviceSplit | None], MemoryPlan],
        model: ModelProfile,
        base: PlanConfig,
        gpus: Sequence[GpuSpec],
        host: HostSpec | None,
    ) -> None:
        self.base, self.host, self.plan = base, host, plan
        self.devs = order_devices(gpus)
        self.nd = len(self.devs)
        self.margin = request.target_mib * MiB
        self.hp_ngl = model.n_layer
        self.hp_nex = model.n_expert or 0
        self.n_streams = 1 if base.kv_unified else max(1, base.n_seq)
        self.n_ctx_auto = request.n_ctx == 0
        self.n_ctx_max = (model.n_ctx_train or 0) * self.n_streams
        self.n_ctx_min_total = request.n_ctx_min * self.n_streams
        if self.n_ctx_auto and not self.n_ctx_max:
            raise FitChoiceError("the model states no training context: give --ctx N")
        self.n_ctx = self.n_ctx_max if self.n_ctx_auto else request.n_ctx
        self.blockers = fit_blockers(base)
        self.source = ", ".join(g.name for g in self.devs) if self.devs else "CPU only"
        # set by the steps
        self.sum_used = self.sum_free = self.surplus = self.sum_model = 0
        self.targets: list[int] = []
        self.names: list[str] = []
        self.overflow: list[str] = []
        self.ngl_pd: list[_Ngl] = []

    # -- measurements ------------------------------------------------------------------------

    def measure(
        self, ngl: int, ts: tuple[int, ...] = (), ot: tuple[str, ...] = (), ctx: int | None = None
    ) -> MemoryPlan:
        cfg = self.base.with_(
            n_ctx=max(1, ctx if ctx is not None else self.n_ctx),
            kv_gpu_layers=None,
            n_gpu_layers=ALL_LAYERS if ngl < 0 else ngl,
            tensor_overrides=tuple(ot) if ot else self.base.tensor_overrides,
        )
        full_ts = [float(x) for x in ts] + [0.0] * (self.nd - len(ts))
        return self.plan(cfg, DeviceSplit(tensor_split=tuple(full_ts)) if any(full_ts) and self.nd > 1 else None)

    def free_of(self, i: int) -> int:
        g = self.devs[i]
        return g.free_bytes if g.free_bytes is not None else g.total_bytes

    def used(self, p: MemoryPlan) -> list[int]:
        by = {d.device: d.total_bytes for d in p.gpus}
        return [by.get(g.device, 0) for g in self.devs]

    @staticmethod
    def host_used(p: MemoryPlan) -> int:
        # llama.cpp sums the host buffer types only: the CPU_REPACK copy is an extra buffer type
        # that is neither host nor a device's, so the weights it holds are not counted
        # (common/fit.cpp common_get_device_memory_data_impl, ggml_backend_buft_is_host)
        h = p.host
        return h.weights_bytes - h.repack_bytes + h.kv_bytes + h.compute_bytes + h.output_bytes

    def choice(self, ngl: int, ts: tuple[int, ...] = (), ot: tuple[str, ...] = (), note: str = "") -> FitChoice:
        return FitChoice(METHOD_PORT, self.n_ctx, ngl, ts, ot, source=self.source, note=note)

    def layout(self, ngl_pd: list[_Ngl], overflow_bufts: list[str]) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
        """``(-ngl, -ts, -ot)`` of a layout (common/fit.cpp ``set_ngl_tensor_split_tbo``)."""
        ngl = sum(x.n_layer for x in ngl_pd)
        ts = [x.n_layer for x in ngl_pd] if self.nd > 1 else []
        while ts and ts[-1] == 0:  # as fit-params.cpp prints it: trailing zeros dropped
            ts.pop()
        il0 = self.hp_ngl + 1 - ngl
        ot: list[str] = []
        for i, x in enumerate(ngl_pd):
            il0 += x.n_full
            for il in range(il0, il0 + x.n_part):
                first = il == il0
                ot.append(
                    f"{overflow_pattern(il, x.overflow if first else _MOE)}={overflow_bufts[i] if first else 'CPU'}"
                )
            il0 += x.n_part
        return ngl, tuple(ts), tuple(ot)

    def mem_for(self, ngl_pd: list[_Ngl], overflow_bufts: list[str]) -> list[int]:
        ngl, ts, ot = self.layout(ngl_pd, overflow_bufts)
        if ngl == 0:
            ts = ()
        return self.used(self.measure(ngl, ts, ot))

    # -- steps -------------------------------------------------------------------------------

    def step_defaults(self) -> FitChoice | None:
        """Step 1: the default parameters; the choice when every device keeps the margin."""
        full = self.measure(-1)
        nd, margin = self.nd, self.margin
        if nd == 0:
            host_total = self.host.total_bytes if self.host is not None else None
            if host_total is None:
                return self.choice(-1, note="host RAM unknown: nothing checked")
            self.sum_used = self.host_used(full)
            self.sum_free = host_total
            if self.sum_free - self.sum_used >= margin:
                return self.choice(-1)
            self.surplus = self.sum_free - self.sum_used - margin
            self.sum_model = full.host.weights_bytes
        else:
            per_used = self.used(full)
            free = [self.free_of(i) for i in range(nd)]
            if all(free[i] - per_used[i] >= margin for i in range(nd)):
                return self.choice(-1)
            self.sum_used, self.sum_free = sum(per_used), sum(free)
            self.surplus = self.sum_free - self.sum_used - margin * nd
            self.sum_model = sum(d.weights_bytes for d in full.gpus)
        return None

    def step_context(self) -> FitChoice | None:
        """Step 2: a smaller context, when the context was left to the model; the choice when
        that alone fits one device (or the host)."""
        nd = self.nd
        if self.surplus < 0 and self.n_ctx_auto and self.n_ctx_max > self.n_ctx_min_total:
            target_sum = self.sum_free - self.margin * max(1, nd)
            if nd > 1:
                per_layer = self.sum_model // self.hp_ngl
                target_sum -= (nd + 1) * per_layer // (2 if self.hp_nex == 0 else 6)
            self.n_ctx = self.n_ctx_min_total
            at_min = self.measure(-1)
            used_min = self.host_used(at_min) if nd == 0 else sum(self.used(at_min))
            if target_sum > used_min:
                self.n_ctx += (
                    (self.n_ctx_max - self.n_ctx_min_total) * (target_sum - used_min) // (self.sum_used - used_min)
                )
                self.n_ctx = max(round_down_ctx(self.n_ctx, self.n_streams), self.n_ctx_min_total)
                if nd <= 1:
                    return self.choice(-1)
        return None

    def check_gives_up(self) -> None:
        """Where ``--fit`` stops before placing layers.

        Raises:
            FitChoiceError: a CPU-only model that reducing the context did not fit, or a
                placement the user set.
        """
        if self.nd == 0:
            raise FitChoiceError(
                "--fit: the model does not fit into system memory by reducing the context "
                "(common/fit.cpp: 'was unable to fit model into system memory by reducing context')"
            )
        if self.blockers:
            raise FitChoiceError(
                f"--fit gives up: {', '.join(self.blockers)} set by the user (common/fit.cpp: 'already set by user, abort')"
            )

    def step_fill_back_to_front(self) -> _MoeFill | None:
        """Step 3: fill the devices back to front by false position (MoE: experts in RAM).
        Leaves the layout in :attr:`ngl_pd` / :attr:`overflow`; returns the MoE step's start
        when step 4 applies, else None."""
        nd = self.nd
        self.names = [g.backend_device for g in self.devs]  # as the build names its buffers (ROCm1)
        self.targets = [self.free_of(i) - self.margin for i in range(nd)]
        surplus_cpu_moe = 0
        if self.hp_nex > 0:
            cpu_moe = self.measure(-1, (), (f"{MOE_ALL_PATTERN}=CPU",))
            u = self.used(cpu_moe)
            surplus_cpu_moe = sum(self.free_of(i) - u[i] - self.margin for i in range(nd))

        self.overflow = ["CPU"] * nd
        ngl_pd = [_Ngl() for _ in range(nd)]
        mem = self.mem_for(ngl_pd, self.overflow)
        for id_ in range(nd - 1, -1, -1):
            ngl_pd, mem = self._fill_device(id_, ngl_pd, mem)
        self.ngl_pd = ngl_pd
        if self.hp_nex == 0 or surplus_cpu_moe <= 0:
            return None
        id_dense_start = nd
        for id_ in range(nd - 1, -1, -1):
            if ngl_pd[id_].n_layer > 0:
                id_dense_start = id_
                continue
            break
        if id_dense_start >= nd:
            return None
        return _MoeFill(ngl_pd, mem, self.overflow, id_dense_start)

    def _fill_device(self, id_: int, ngl_pd: list[_Ngl], mem: list[int]) -> tuple[list[_Ngl], list[int]]:
        """Step 3 for device ``id_``: as many of the unassigned layers as fit its target."""
        nd, targets, overflow = self.nd, self.targets, self.overflow
        n_unassigned = self.hp_ngl + 1 - sum(ngl_pd[j].n_layer for j in range(id_ + 1, nd))
        high = _copy(ngl_pd)
        high[id_].n_layer = n_unassigned
        if self.hp_nex > 0:
            high[id_].n_part = high[id_].n_layer if id_ < nd - 1 else high[id_].n_layer - 1
        if high[id_].n_layer > 0:
            mem_high = self.mem_for(high, overflow)
            if mem_high[id_] > targets[id_]:
                delta = high[id_].n_layer - ngl_pd[id_].n_layer
                while delta > 1:
                    step = _u32(int(delta * (targets[id_] - mem[id_]) / (mem_high[id_] - mem[id_])))
                    step = min(max(step, 1), delta - 1)
                    test = _copy(ngl_pd)
                    test[id_].n_layer += step
                    if self.hp_nex:
                        test[id_].n_part += step - 1 if id_ == nd - 1 and test[id_].n_part == 0 else step
                    mem_test = self.mem_for(test, overflow)
                    if mem_test[id_] <= targets[id_]:
                        ngl_pd, mem = test, mem_test
                    else:
                        high, mem_high = test, mem_test
                    delta = high[id_].n_layer - ngl_pd[id_].n_layer
            else:
                ngl_pd, mem = high, mem_high
        return ngl_pd, mem

    def step_moe_front_to_back(self, st: _MoeFill) -> FitChoice:
        """Step 4 (MoE, every dense tensor fits): whole layers in front, front to back."""
        id_ = 0
        while id_ <= st.id_dense_start and st.id_dense_start < self.nd:
            self._whole_layers_to(id_, st)
            self._one_more_part(id_, st)
            id_ += 1
        return self.choice(*self.layout(st.ngl_pd, st.overflow))

    def _whole_layers_to(self, id_: int, st: _MoeFill) -> None:
        """Step 4 for device ``id_``: convert the partial layers of the devices from
        ``id_dense_start`` on into whole layers on ``id_``, as many as fit (false position)."""
        nd, targets, overflow = self.nd, self.targets, st.overflow
        high = _copy(st.ngl_pd)
        for jd in range(st.id_dense_start, nd):
            move = high[jd].n_layer if jd < nd - 1 else high[jd].n_layer - 1
            high[id_].n_layer += move
            high[jd].n_layer -= move
            high[jd].n_part = 0
        dense_high = nd - 1
        mem_high = self.mem_for(high, overflow)
        if mem_high[id_] <= targets[id_]:
            st.ngl_pd, st.mem, st.id_dense_start = high, mem_high, dense_high
            return
        delta = high[id_].n_full - st.ngl_pd[id_].n_full
        while delta > 1:
            mem = st.mem
            step = _u32(int(delta * (targets[id_] - mem[id_]) / (mem_high[id_] - mem[id_])))
            step = min(max(step, 1), delta - 1)
            test = _copy(st.ngl_pd)
            dense_test = st.id_dense_start
            converted = 0
            while dense_test < nd:
                n_conv = min(step - converted, test[dense_test].n_part)
                test[dense_test].n_layer -= n_conv
                test[dense_test].n_part -= n_conv
                test[id_].n_layer += n_conv
                converted += n_conv
                if test[dense_test].n_part > 0:
                    break
                dense_test += 1
            mem_test = self.mem_for(test, overflow)
            if mem_test[id_] <= targets[id_]:
                st.ngl_pd, st.mem, st.id_dense_start = test, mem_test, dense_test
            else:
                high, mem_high, dense_high = test, mem_test, dense_test
            delta = high[id_].n_full - st.ngl_pd[id_].n_full

    def _one_more_part(self, id_: int, st: _MoeFill) -> None:
        """Step 4's "try to fit at least part of one more layer" on device ``id_``: its FFN up to
        the up, gate or attention fraction, the rest overflowing to the next device."""
        nd, targets = self.nd, self.targets
        if not (st.id_dense_start < nd and st.ngl_pd[st.id_dense_start].n_layer > (0 if id_ < nd - 1 else 1)):
            return
        test = _copy(st.ngl_pd)
        dense_test = st.id_dense_start
        test[dense_test].n_layer -= 1
        test[dense_test].n_part -= 1
        test[id_].n_layer += 1
        test[id_].n_part += 1
        if test[dense_test].n_part == 0:
            dense_test += 1
        overflow_test = list(st.overflow)
        if id_ < nd - 1:
            overflow_test[id_] = self.names[id_ + 1]

        def ok(m: list[int]) -> bool:
            return m[id_] < targets[id_] and (id_ + 1 == nd or m[id_ + 1] < targets[id_ + 1])

        for fraction in (_UP, _GATE):
            test[id_].overflow = fraction
            m = self.mem_for(test, overflow_test)
            if not ok(m):
                if fraction == _UP:
                    test[id_].overflow = _ATTN
                    m = self.mem_for(test, overflow_test)
                    if ok(m):
                        st.ngl_pd, st.overflow, st.mem, st.id_dense_start = _copy(test), overflow_test, m, dense_test
                break
            st.ngl_pd, st.overflow, st.mem, st.id_dense_start = _copy(test), overflow_test, m, dense_test


def predict_choice(
    choice: FitChoice,
    model: ModelProfile,
    base: PlanConfig,
    gpus: Sequence[GpuSpec],
    host: HostSpec | None,
    inputs: Any,
    *,
    vram_margin_bytes: int = FIT_TARGET_MIB * MiB,
    rules: BuildRules = VENDORED,
) -> FitChoice:
    """``choice`` with kvtuner's prediction of it: decode tokens/s at the full context (depth
    ``n_ctx_seq - 1``, as the tune ranks) and prefill tokens/s of a 512-token prompt, and whether
    its plan keeps every GPU within capacity less ``vram_margin_bytes``. A configuration kvtuner
    cannot plan keeps None and says so in ``note``. ``rules``: the build and program planned for
    (:mod:`kvtuner.core.plan.build_rules`)."""
    from ..speed.speed_model import SpeedModelError, decode_tok_s, prefill_tok_s

    try:
        cfg, split = choice.config(base, len(gpus))
        p = plan_memory(model, cfg, gpus, host, split=split, rules=rules)
    except ConfigError as exc:
        return replace(choice, note="; ".join(x for x in (choice.note, f"not planned: {exc}") if x))
    # --fit looks at the GPUs only: the fit verdict's GPU part with this margin
    fits = fit_verdict(p, FitMargins(vram_margin_bytes=vram_margin_bytes)).gpu_fits
    dec = pre = None
    if inputs is not None:
        try:
            dec = decode_tok_s(p, inputs, p.n_ctx_seq - 1)
            pre = prefill_tok_s(p, inputs, max(1, min(512, p.n_ctx_seq)), 0)
        except SpeedModelError:
            pass
    return replace(choice, decode_tok_s=dec, prefill_tok_s=pre, fits=fits)


__all__ = [
    "FIT_MIN_CTX",
    "FIT_TARGET_MIB",
    "METHOD_BINARY",
    "METHOD_PORT",
    "MOE_ALL_PATTERN",
    "FitChoice",
    "FitChoiceError",
    "FitRequest",
    "fit_blockers",
    "fit_params_args",
    "overflow_pattern",
    "parse_fit_line",
    "port_fit_choice",
    "predict_choice",
]
