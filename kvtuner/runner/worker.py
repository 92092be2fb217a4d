"""The runner's child process: the only module of kvtuner that imports ``llama_cpp``.

Started as ``python -m kvtuner.runner`` by :class:`kvtuner.runner.client.RunnerClient`.
It reads commands (JSON lines, :mod:`kvtuner.runner.protocol`) on stdin and writes events on
the stdout it was given. Right at start it moves that stdout to a private descriptor and
points fd 1 at stderr, so nothing printed by C code can corrupt the protocol stream.

Lifetime: a thread reads stdin; on EOF (the parent closed the pipe, or died and the kernel
closed it) the process exits at once with ``os._exit``, even in the middle of a llama.cpp
call (ctypes releases the GIL). A second thread exits when the parent pid changes (the
child was re-parented), as a backstop.

Test hook (tests only): ``KVTUNER_RUNNER_FAULT="action@point[,action@point]"`` makes the
worker misbehave once at a named point. Points: ``started`` (before the started event),
``load_progress`` (first progress callback), ``context`` (before creating the context),
``decode`` (before the first generated token). Actions: ``abort`` (``os.abort()``),
``ggml_abort`` (only at ``context``: an invalid flash_attn enum makes llama.cpp itself hit
``GGML_ABORT`` in ``llama_flash_attn_type_name``), ``sigkill`` (kill itself, as the OOM
killer would), ``exit`` (``os._exit(7)``), ``hang`` (sleep forever), ``stall`` (wait until cancelled), ``deaf`` (ignore
SIGTERM, then hang), ``garbage`` (write a line that is not JSON to the protocol stream).
"""

from __future__ import annotations

import collections
import ctypes
import os
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.hardware.host import physical_cores
from ..core.model.ggml_types import kv_type
from ..core.plan.config import ConfigError, PlanConfig
from ..core.plan.placement import LayerPlacement, placement_for, tensor_overrides
from . import llama_log as L
from . import protocol as P
from .protocol import field_names as _field_names
from .structure_probe import DEBUG_RECORDS, collect_facts

FAULT_ENV = "KVTUNER_RUNNER_FAULT"
EXIT_OK = 0
EXIT_NO_LLAMA = 3
EXIT_PARENT_GONE = 4

# llama.h enums
_FA = {"auto": -1, "off": 0, "on": 1}
_LOAD_MODE_NONE, _LOAD_MODE_MMAP = 0, 1
_LOG_TAIL_LINES = 60
_UINT32_MAX = 2**32 - 1


class _CommandFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _parse_faults(text: str | None) -> dict[str, str]:
    faults: dict[str, str] = {}
    for item in (text or "").split(","):
        if "@" in item:
            action, point = item.strip().split("@", 1)
            faults[point.strip()] = action.strip()
    return faults


def _peak_rss_bytes() -> int:
    """This process's peak resident memory in bytes: ``getrusage`` ``ru_maxrss`` on POSIX (KiB on
    Linux, bytes on macOS); on Windows, where the ``resource`` module does not exist, psutil's
    peak working set (``GetProcessMemoryInfo`` ``PeakWorkingSetSize``)."""
    if sys.platform == "win32":
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", 0) or info.rss)
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss if sys.platform == "darwin" else maxrss * 1024)


class Worker:
    """The child's state: one model and context at most, the log sink, the command loop."""

    def __init__(self, proto_out: Any) -> None:
        self._out = proto_out
        self._out_lock = threading.Lock()
        self._log_lock = threading.RLock()
        self._cancel = threading.Event()
        self._commands: queue.Queue[P.Message] = queue.Queue()
        self._faults = _parse_faults(os.environ.get(FAULT_ENV))
        self._assembler = L.LineAssembler()
        self._tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL_LINES)
        self._records: list[L.Record] = []
        self._errors: list[L.LogError] = []
        self._send_logs = True
        self._capture_debug = False
        self.llama: Any = None
        self._ggml: Any = None
        self.model: Any = None
        self.ctx: Any = None
        self.n_vocab = 0
        self.n_threads = 1
        self.devices: tuple[str, ...] = ()
        self.device_descriptions: tuple[str, ...] = ()
        self.gpu_offload = False
        self.build = ""
        self._keep: list[Any] = []  # ctypes objects llama.cpp holds pointers to

    # -- output ------------------------------------------------------------------------------

    def emit(self, msg: P.Message) -> None:
        """Write one event line; exit if the parent is gone."""
        self._write_raw((P.encode(msg) + "\n").encode("utf-8"))

    def _write_raw(self, data: bytes) -> None:
        with self._out_lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError):
                os._exit(EXIT_PARENT_GONE)

    def fault(self, point: str) -> None:
        """Run the test hook for ``point`` once (see module docstring)."""
        action = self._faults.pop(point, None)
        if action is None or action == "ggml_abort":
            if action == "ggml_abort":
                self._faults[point] = action  # handled by the caller
            return
        if action == "abort":
            os.abort()
        elif action == "sigkill":
            os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows: TerminateProcess
        elif action == "exit":
            os._exit(7)
        elif action == "hang":
            while True:
                time.sleep(3600)
        elif action == "stall":  # wait (up to 60 s) until cancelled: a slow but responsive step
            deadline = time.monotonic() + 60
            while not self._cancel.is_set() and time.monotonic() < deadline:
                time.sleep(0.02)
        elif action == "deaf":  # ignore SIGTERM, then hang: only SIGKILL ends it
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(3600)
        elif action == "garbage":
            self._write_raw(b"this is not a protocol line {\n")

    # -- llama.cpp log sink ------------------------------------------------------------------

    def _on_log(self, level: int, text: bytes | None, _user: Any) -> None:
        try:
            with self._log_lock:
                for lvl, line in self._assembler.feed(level, (text or b"").decode("utf-8", "replace")):
                    self._on_line(lvl, line)
        except Exception:  # never raise into C
            pass

    def _on_line(self, level: int, line: str) -> None:
        if level == L.LEVEL_DEBUG:
            # DEBUG lines are dropped, except the per-layer memory lines a dry run's structure
            # probe reads (runner/structure_probe.py)
            if self._capture_debug:
                rec = L.parse_line(line, level)
                if isinstance(rec, DEBUG_RECORDS):
                    self._records.append(rec)
            return
        if not line.strip():
            return
        self._tail.append(line)
        if self._send_logs:
            self.emit(P.LogEvent(level=L.LEVEL_NAMES.get(level, str(level)), text=line))
        rec = L.parse_line(line, level)
        if rec is None:
            return
        self._records.append(rec)
        if isinstance(rec, L.LogError):
            self._errors.append(rec)
        ev = L.record_event(rec)
        if ev is not None:
            self.emit(ev)

    def _begin_capture(self) -> None:
        with self._log_lock:
            self._records = []
            self._errors = []

    # -- start-up ----------------------------------------------------------------------------

    def start(self) -> None:
        """Import llama_cpp, install the log callback, describe the backends, say ``started``."""
        try:
            import llama_cpp
        except Exception as exc:
            self.emit(P.ErrorEvent(kind="crashed", message=f"llama-cpp-python is not importable: {exc}"))
            os._exit(EXIT_NO_LLAMA)
        self.llama = llama_cpp
        self._log_cb = llama_cpp.llama_log_callback(self._on_log)  # keep a reference
        llama_cpp.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        self._load_ggml()
        self.build = f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}"
        try:
            info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
        except Exception:
            info = ""
        self.fault("started")
        self.emit(
            P.StartedEvent(
                pid=os.getpid(),
                protocol_version=P.PROTOCOL_VERSION,
                llama_build=self.build,
                devices=self.devices,
                device_descriptions=self.device_descriptions,
                gpu_offload_supported=self.gpu_offload,
                system_info=info,
            )
        )

    def _load_ggml(self) -> None:
        """ggml backend registry through ctypes (libggml ships with llama-cpp-python)."""
        try:
            try:
                from llama_cpp._ggml import libggml as lib
            except Exception:
                from pathlib import Path

                lib = ctypes.CDLL(str(Path(self.llama.__file__).parent / "lib" / "libggml.so"))
            vp = ctypes.c_void_p
            lib.ggml_backend_dev_count.restype = ctypes.c_size_t
            lib.ggml_backend_dev_count.argtypes = []
            lib.ggml_backend_dev_get.restype = vp
            lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
            lib.ggml_backend_dev_name.restype = ctypes.c_char_p
            lib.ggml_backend_dev_name.argtypes = [vp]
            lib.ggml_backend_dev_description.restype = ctypes.c_char_p
            lib.ggml_backend_dev_description.argtypes = [vp]
            lib.ggml_backend_dev_by_name.restype = vp
            lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
            lib.ggml_backend_dev_buffer_type.restype = vp
            lib.ggml_backend_dev_buffer_type.argtypes = [vp]
            names, descs = [], []
            for i in range(lib.ggml_backend_dev_count()):
                dev = lib.ggml_backend_dev_get(i)
                names.append((lib.ggml_backend_dev_name(dev) or b"?").decode())
                descs.append((lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"))
            self._ggml = lib
            self.devices, self.device_descriptions = tuple(names), tuple(descs)
        except Exception:
            self._ggml = None

    # -- command loop ------------------------------------------------------------------------

    def read_stdin(self) -> None:
        """Reader thread: queue commands, handle cancel at once, exit on EOF."""
        stdin = sys.stdin.buffer
        while True:
            try:
                line = stdin.readline()
            except Exception:
                line = b""
            if not line:
                os._exit(EXIT_OK)
            if not line.strip():
                continue
            try:
                cmd = P.decode_command(line)
            except P.ProtocolError as exc:
                self.emit(P.ErrorEvent(kind="protocol_error", message=f"bad command line: {exc}"))
                continue
            if isinstance(cmd, P.CancelCommand):
                self._cancel.set()
                continue
            self._cancel.clear()
            self._commands.put(cmd)

    def serve(self) -> None:
        """Main thread: run commands one at a time until shutdown."""
        handlers: dict[type, Callable[[Any], None]] = {
            P.DryRunCommand: self._cmd_dry_run,
            P.LoadCommand: self._cmd_load,
            P.BenchCommand: self._cmd_bench,
            P.UnloadCommand: self._cmd_unload,
        }
        while True:
            cmd = self._commands.get()
            if isinstance(cmd, P.ShutdownCommand):
                self._free()
                return
            try:
                handlers[type(cmd)](cmd)
            except _CommandFailed as exc:
                self.emit(P.ErrorEvent(kind=exc.kind, message=exc.message, log_tail=tuple(self._tail)))
            except Exception as exc:  # a bug in the worker: report, keep serving
                self.emit(
                    P.ErrorEvent(
                        kind="crashed", message=f"worker error: {type(exc).__name__}: {exc}", log_tail=tuple(self._tail)
                    )
                )

    # -- model and context -------------------------------------------------------------------

    @staticmethod
    def _config(data: dict) -> PlanConfig:
        try:
            cfg = PlanConfig.from_dict(dict(data))
        except ConfigError as exc:
            raise _CommandFailed("invalid_config", str(exc)) from None
        except TypeError as exc:
            raise _CommandFailed("invalid_config", f"bad configuration: {exc}") from None
        for name, flag in (("n_ctx", "--ctx"), ("n_batch", "--batch"), ("n_ubatch", "--ubatch")):
            if getattr(cfg, name) > _UINT32_MAX:  # llama_context_params holds uint32_t
                raise _CommandFailed(
                    "invalid_config", f"{flag} {getattr(cfg, name)} is too large for llama.cpp (max {_UINT32_MAX})"
                )
        return cfg

    @staticmethod
    def _check_model_file(path: str) -> None:
        problem = P.model_file_problem(path)
        if problem:
            raise _CommandFailed("model_error", problem)

    def _n_layer_of(self, path: str) -> int:
        """n_layer of the model without reading weights: ``{arch}.block_count`` from a
        vocab-only load (which leaves hparams unset), else a no_alloc load."""
        lc = self.llama

        def meta(model: Any, key: str) -> str | None:
            buf = ctypes.create_string_buffer(256)
            n = lc.llama_model_meta_val_str(model, key.encode(), buf, ctypes.sizeof(buf))
            return buf.value.decode("utf-8", "replace") if n >= 0 else None

        mp = lc.llama_model_default_params()
        mp.vocab_only = True
        mp.load_mode = _LOAD_MODE_NONE
        model = lc.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise self._load_failure(path)
        try:
            arch = meta(model, "general.architecture")
            count = meta(model, f"{arch}.block_count") if arch else None
            if count and count.strip().isdigit() and int(count) > 0:
                return int(count)
        finally:
            lc.llama_model_free(model)
        mp = lc.llama_model_default_params()
        mp.no_alloc = True
        mp.load_mode = _LOAD_MODE_NONE
        model = lc.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise self._load_failure(path)
        try:
            return int(lc.llama_model_n_layer(model))
        finally:
            lc.llama_model_free(model)

    def _placement(self, path: str, cfg: PlanConfig) -> tuple[LayerPlacement | None, list[str]]:
        if cfg.kv_gpu_layers is None and not tensor_overrides(cfg):
            return None, []
        try:
            placement = placement_for(cfg, lambda: self._n_layer_of(path))
        except ConfigError as exc:
            raise _CommandFailed("invalid_config", str(exc)) from None
        warnings: list[str] = []
        if placement.tensor_overrides and not self.gpu_offload:
            # without GPU offload every weight is in a CPU buffer already: overrides to CPU are
            # no-ops (passed anyway), overrides to a GPU would name a device this build lacks
            gpu_ot = tuple(o for o in placement.weight_overrides if o[1] != "CPU")
            if gpu_ot:
                warnings.append("tensor overrides to a GPU ignored: this llama.cpp build has no GPU offload")
                placement = replace(
                    placement, weight_overrides=tuple(o for o in placement.weight_overrides if o[1] == "CPU")
                )
        if placement.experimental and not self.gpu_offload:
            warnings.append(
                "kv_gpu_layers split ignored: this llama.cpp build has no GPU offload (everything is on the CPU)"
            )
            placement = LayerPlacement(
                placement.n_gpu_layers,
                True,
                tuple(o for o in placement.tensor_overrides if o[1] == "CPU"),
                placement.offloaded_repeating_layers,
                placement.kv_gpu_layers,
                False,
                tensor_overrides=placement.tensor_overrides,
            )
        elif placement.experimental:
            warnings.append(
                f"KV of {placement.kv_gpu_layers} of {placement.offloaded_repeating_layers} offloaded "
                "layers in VRAM via tensor overrides (the others' KV stays in RAM)"
            )
        return placement, warnings

    def _load_failure(self, path: str) -> _CommandFailed:
        if self._cancel.is_set():
            return _CommandFailed("cancelled", "model load cancelled")
        oom = [e for e in self._errors if e.kind == "out_of_memory"]
        if oom:
            return _CommandFailed("out_of_memory", f"out of memory while loading {path}: {oom[0].message}")
        reasons = [e.message for e in self._errors if "error loading model" in e.message] or [
            e.message for e in self._errors
        ]
        reason = reasons[0] if reasons else "llama.cpp could not load it"
        reason = reason.replace("error loading model: ", "")
        return _CommandFailed("model_error", f"cannot load model {path}: {reason}")

    def _context_failure(self) -> _CommandFailed:
        oom = [e for e in self._errors if e.kind == "out_of_memory"]
        if oom:
            return _CommandFailed("out_of_memory", f"out of memory while creating the context: {oom[0].message}")
        reasons = [e.message for e in self._errors]
        reason = reasons[-1] if reasons else "no reason logged"
        reason = reason.replace("failed to initialize the context: ", "")
        return _CommandFailed("invalid_config", f"llama.cpp refused the context: {reason}")

    def _model_params(self, cfg: PlanConfig, placement: LayerPlacement | None, *, dry: bool, progress: bool) -> Any:
        lc = self.llama
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = placement.n_gpu_layers if placement else cfg.n_gpu_layers
        # a dry run must not mmap: llama-model.cpp GGML_ASSERT(!ml.no_alloc) on mapped buffers
        mp.load_mode = _LOAD_MODE_NONE if dry or not cfg.use_mmap else _LOAD_MODE_MMAP
        mp.no_alloc = bool(dry)
        if placement and placement.weight_overrides:
            mp.tensor_buft_overrides = self._overrides(placement.weight_overrides)
        if progress:
            state = {"last": -1.0, "first": True}

            def _progress(value: float, _user: Any) -> bool:
                if value >= 1.0 or value - state["last"] >= 0.01:
                    state["last"] = value
                    self.emit(P.LoadProgressEvent(progress=round(float(value), 4)))
                if state["first"]:
                    state["first"] = False
                    self.fault("load_progress")
                return not self._cancel.is_set()

            cb = lc.llama_progress_callback(_progress)
            self._keep.append(cb)
            mp.progress_callback = cb
        return mp

    def _overrides(self, pairs: tuple[tuple[str, str], ...]) -> int:
        """NULL-terminated ``llama_model_tensor_buft_override`` array (llama.h)."""
        if self._ggml is None:
            raise _CommandFailed(
                "invalid_config", "tensor overrides need libggml's device registry, which is unavailable"
            )

        class Override(ctypes.Structure):
            _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

        arr = (Override * (len(pairs) + 1))()
        for i, (pattern, device) in enumerate(pairs):
            dev = self._ggml.ggml_backend_dev_by_name(device.encode())
            if not dev:
                raise _CommandFailed(
                    "invalid_config", f"device {device} not found (devices: {', '.join(self.devices) or 'none'})"
                )
            pat = ctypes.c_char_p(pattern.encode())
            self._keep.append(pat)
            arr[i].pattern = pat
            arr[i].buft = self._ggml.ggml_backend_dev_buffer_type(dev)
        arr[len(pairs)].pattern = None
        arr[len(pairs)].buft = None
        self._keep.append(arr)
        return ctypes.cast(arr, ctypes.c_void_p).value or 0

    def _context_params(self, cfg: PlanConfig, placement: LayerPlacement | None, n_threads: int) -> Any:
        lc = self.llama
        cp = lc.llama_context_default_params()
        cp.n_ctx = cfg.n_ctx
        cp.n_batch = cfg.n_batch
        cp.n_ubatch = min(cfg.n_ubatch, cfg.n_batch)
        cp.n_seq_max = cfg.n_seq
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.type_k = kv_type(cfg.type_k).ggml_id
        cp.type_v = kv_type(cfg.type_v).ggml_id
        cp.flash_attn_type = _FA[cfg.flash_attn]
        cp.swa_full = bool(cfg.swa_full)  # explicit: the C default is true
        cp.kv_unified = bool(cfg.kv_unified)
        if placement is not None:
            cp.offload_kqv = placement.offload_kqv
        elif cfg.kv_gpu_layers == 0:
            cp.offload_kqv = False
        cp.no_perf = False
        if self._faults.get("context") == "ggml_abort":
            cp.flash_attn_type = 99  # test hook: llama_flash_attn_type_name() hits GGML_ABORT
        else:
            self.fault("context")
        return cp

    def _free(self) -> None:
        lc = self.llama
        if self.ctx is not None:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.model is not None:
            lc.llama_model_free(self.model)
            self.model = None
        self._keep.clear()

    def _context_event(self, cfg: PlanConfig) -> P.ContextEvent:
        return L.context_event(self._records, n_seq=cfg.n_seq, n_batch=cfg.n_batch, n_ubatch=cfg.n_ubatch)

    # -- commands ----------------------------------------------------------------------------

    def _cmd_dry_run(self, cmd: P.DryRunCommand) -> None:
        cfg = self._config(cmd.config)
        self._check_model_file(cmd.model_path)
        self._begin_capture()  # a loaded model (if any) stays loaded
        self._tail.clear()
        placement, _ = self._placement(cmd.model_path, cfg)
        lc = self.llama
        mp = self._model_params(cfg, placement, dry=True, progress=False)
        model = lc.llama_model_load_from_file(cmd.model_path.encode(), mp)
        if not model:
            raise self._load_failure(cmd.model_path)
        try:
            cp = self._context_params(cfg, placement, 1)
            self._capture_debug = True
            try:
                ctx = lc.llama_init_from_model(model, cp)
            finally:
                self._capture_debug = False
            if not ctx:
                raise self._context_failure()
            lc.llama_free(ctx)
        finally:
            lc.llama_model_free(model)
        recs = list(self._records)
        self.emit(
            P.DryRunResultEvent(
                result=L.dry_run_report(
                    recs,
                    gpu_offload_supported=self.gpu_offload,
                    devices=self.devices,
                    llama_build=self.build,
                    log_tail=tuple(self._tail),
                    structure_facts=collect_facts(recs),
                )
            )
        )

    def _cmd_load(self, cmd: P.LoadCommand) -> None:
        cfg = self._config(cmd.config)
        self._check_model_file(cmd.model_path)
        self._free()
        self._begin_capture()
        self._tail.clear()
        lc = self.llama
        placement, warnings = self._placement(cmd.model_path, cfg)
        self.n_threads = int(cmd.n_threads or physical_cores())
        t0 = time.perf_counter()
        mp = self._model_params(cfg, placement, dry=False, progress=True)
        model = lc.llama_model_load_from_file(cmd.model_path.encode(), mp)
        if not model:
            self._keep.clear()
            raise self._load_failure(cmd.model_path)
        self.model = model
        t1 = time.perf_counter()
        if self._cancel.is_set():
            self._free()
            raise _CommandFailed("cancelled", "model load cancelled")
        cp = self._context_params(cfg, placement, self.n_threads)
        ctx = lc.llama_init_from_model(model, cp)
        if not ctx:
            self._free()
            raise self._context_failure()
        self.ctx = ctx
        t2 = time.perf_counter()
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model)))
        self.emit(self._context_event(cfg))
        self.emit(
            P.LoadedEvent(
                load_s=t2 - t0,
                load_model_s=t1 - t0,
                create_context_s=t2 - t1,
                n_layer=int(lc.llama_model_n_layer(model)),
                n_vocab=self.n_vocab,
                n_ctx_train=int(lc.llama_model_n_ctx_train(model)),
                n_threads=self.n_threads,
                kv_split_experimental=bool(placement and placement.experimental),
                warnings=tuple(warnings),
            )
        )

    def _cmd_unload(self, _cmd: P.UnloadCommand) -> None:
        self._free()
        self.emit(P.UnloadedEvent())

    def _decode(self, tokens: list[int]) -> None:
        lc = self.llama
        arr = (lc.llama_token * len(tokens))(*tokens)
        ret = lc.llama_decode(self.ctx, lc.llama_batch_get_one(arr, len(tokens)))
        if ret != 0:
            oom = [e for e in self._errors if e.kind == "out_of_memory"]
            if oom:
                raise _CommandFailed("out_of_memory", f"out of memory while decoding: {oom[-1].message}")
            if ret == 1:
                raise _CommandFailed("invalid_config", "llama_decode found no KV cache slot for the batch: raise --ctx")
            last = self._errors[-1].message if self._errors else "no reason logged"
            raise _CommandFailed("crashed", f"llama_decode failed with status {ret}: {last}")

    def _argmax(self) -> int:
        import numpy as np

        ptr = self.llama.llama_get_logits_ith(self.ctx, -1)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise _CommandFailed("cancelled", "benchmark cancelled")

    def _cmd_bench(self, cmd: P.BenchCommand) -> None:
        if self.ctx is None:
            raise _CommandFailed("invalid_config", "no model loaded: send a load command before bench")
        for name in ("n_prompt", "n_gen", "n_depth"):
            if int(getattr(cmd, name)) < 0:
                raise _CommandFailed("invalid_config", f"{name} must be 0 or more")
        if cmd.repetitions < 1:
            raise _CommandFailed("invalid_config", "repetitions must be 1 or more")
        lc = self.llama
        ctx = self.ctx
        n_ctx_seq = int(lc.llama_n_ctx_seq(ctx))
        need = cmd.n_depth + cmd.n_prompt + cmd.n_gen
        if need > n_ctx_seq:
            raise _CommandFailed(
                "invalid_config",
                f"the bench needs {need} tokens of context (depth {cmd.n_depth} + prompt {cmd.n_prompt} + "
                f"gen {cmd.n_gen}) but a sequence holds {n_ctx_seq}: raise --ctx or lower -d/-p/-n",
            )
        self._begin_capture()
        n_batch = int(lc.llama_n_batch(ctx))
        mem = lc.llama_get_memory(ctx)
        rng = random.Random(cmd.seed)
        vocab = self.n_vocab

        def rand_tokens(n: int) -> list[int]:
            return [rng.randrange(vocab) for _ in range(n)]

        def feed(tokens: list[int], rep: int, report: bool) -> None:
            for i in range(0, len(tokens), n_batch):
                self._check_cancel()
                self._decode(tokens[i : i + n_batch])
                if report:
                    self.emit(
                        P.PrefillProgressEvent(rep=rep, n_done=min(i + n_batch, len(tokens)), n_total=len(tokens))
                    )

        if cmd.warmup:  # llama-bench: one prompt batch and one generated token, untimed
            lc.llama_memory_clear(mem, True)
            feed(rand_tokens(max(1, min(cmd.n_prompt, n_batch))), -1, False)
            if cmd.n_gen:
                self._decode(rand_tokens(1))
            lc.llama_synchronize(ctx)
        reps: list[P.Repetition] = []
        first_decode = True
        for rep in range(cmd.repetitions):
            lc.llama_memory_clear(mem, True)
            if cmd.n_depth:
                feed(rand_tokens(cmd.n_depth), rep, False)
            lc.llama_synchronize(ctx)
            lc.llama_perf_context_reset(ctx)
            prompt = rand_tokens(cmd.n_prompt)
            t0 = time.perf_counter()
            prefill_s = ttft_s = 0.0
            if prompt:
                feed(prompt, rep, True)
                lc.llama_synchronize(ctx)
                prefill_s = time.perf_counter() - t0
                token = self._argmax()
                ttft_s = time.perf_counter() - t0
                self.emit(
                    P.PrefillResultEvent(
                        rep=rep,
                        n_depth=cmd.n_depth,
                        n_tokens=len(prompt),
                        prefill_s=prefill_s,
                        tok_s=len(prompt) / prefill_s if prefill_s > 0 else 0.0,
                    )
                )
            else:
                token = rand_tokens(1)[0]
            if first_decode and cmd.n_gen:
                first_decode = False
                self.fault("decode")
            t_dec = time.perf_counter()
            perf = time.perf_counter
            for i in range(cmd.n_gen):
                self._check_cancel()
                ts = perf()
                self._decode([token])
                token = self._argmax()
                te = perf()
                self.emit(P.TokenEvent(rep=rep, index=i, token=token, dt_s=te - ts, t_s=te - t_dec))
            decode_s = time.perf_counter() - t_dec
            if not prompt and cmd.n_gen:
                ttft_s = 0.0
            rec = P.RepResultEvent(
                rep=rep,
                n_depth=cmd.n_depth,
                n_prompt=len(prompt),
                prefill_s=prefill_s,
                n_gen=cmd.n_gen,
                decode_s=decode_s,
                ttft_s=ttft_s,
            )
            self.emit(rec)
            reps.append(P.Repetition.of({k: getattr(rec, k) for k in _field_names(rec)}))
        pd = lc.llama_perf_context(ctx)
        perf_dict = {k: getattr(pd, k) for k in ("t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval", "n_eval")}
        self.emit(
            P.BenchResultEvent(
                reps=tuple(reps), peak_rss_bytes=_peak_rss_bytes(), n_threads=self.n_threads, perf=perf_dict
            )
        )


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(EXIT_PARENT_GONE)


def main() -> int:
    """Entry point of ``python -m kvtuner.runner``; exits the process (status 0 on shutdown)."""
    # Keep the protocol on a private fd; C code printing to stdout lands on stderr instead.
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out = os.fdopen(proto_fd, "wb", buffering=0)
    worker = Worker(out)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    threading.Thread(target=worker.read_stdin, name="stdin-reader", daemon=True).start()
    worker.start()
    worker.serve()
    # Leave without interpreter finalisation or C++ static destructors: they race with
    # llama.cpp's/OpenMP's threads and the stdin reader (seen as a rare SIGABRT at exit).
    os._exit(EXIT_OK)
