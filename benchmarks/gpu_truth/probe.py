"""One llama.cpp load in this process, with every log line and the memory at each stage.

Independent of kvtuner on purpose (it imports neither ``kvtuner`` nor its runner): the GPU truth
run compares kvtuner's plan with what llama.cpp itself reports and allocates, so the instrument
must not share kvtuner's code. Run as a child process by ``gpu_truth.py``::

    python probe.py SPEC.json RESULT.json

``SPEC.json`` (all keys optional except ``model``)::

    {"model": "/path/model.gguf", "n_gpu_layers": -1, "overrides": [["^blk\\.(0|1)\\.", "CUDA0"]],
     "use_mmap": true, "no_alloc": false,
     "ctx": {"n_ctx": 8192, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 1, "type_k": "f16",
             "type_v": "f16", "flash_attn": "on", "offload_kqv": true, "swa_full": false,
             "kv_unified": false, "n_threads": 4, "op_offload": true},
     "exercise": {"n_prompt": 512, "n_gen": 1},   # decode after creating the context (or null)
     "bench": {"depths": [0, 8192], "n_prompt": 4096, "n_gen": 32},  # timed, instead of exercise

     "memory": true}                               # read NVML / cudaMemGetInfo at each stage

``RESULT.json``: ``{"ok", "error", "stage", "log" (every INFO/WARN/ERROR line), "memory" (one
record per stage: NVML device used/free bytes, this process's NVML bytes, cudaMemGetInfo
free/total bytes, RSS bytes), "timings_s", "llama": {"version", "gpu_offload", "devices",
"system_info"}, "n_vocab"}``. The parent parses the log lines (llama.cpp's own printf formats).

The result file is written after every stage, so an abort inside llama.cpp (GGML_ASSERT) still
leaves what was reached; the parent adds the child's stderr tail.

Sources: llama.h (``llama_model_params``, ``llama_context_params``,
``llama_model_tensor_buft_override``), ggml-backend.h (device registry), CUDA runtime API
(``cudaMemGetInfo``: free and total device memory in bytes, creating the primary context on
first use), NVML (``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetComputeRunningProcesses``).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import sys
import time
from typing import Any

#: ggml_type ids (ggml/include/ggml.h) of the KV cache types llama.cpp accepts for -ctk/-ctv.
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
#: enum llama_flash_attn_type (llama.h).
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
#: enum llama_load_mode (llama.h): 0 reads into buffers, 1 memory-maps.
LOAD_MODE_NONE, LOAD_MODE_MMAP = 0, 1
#: enum ggml_log_level (ggml.h): DEBUG 1 is dropped, CONT 5 continues the previous line.
LEVEL_DEBUG, LEVEL_CONT = 1, 5
LEVEL_NAMES = {0: "none", 2: "info", 3: "warn", 4: "error"}


class Probe:
    """State of the one load: log lines, memory records, the result document."""

    def __init__(self, spec: dict, result_path: str) -> None:
        self.spec = spec
        self.result_path = result_path
        self.t0 = time.monotonic()
        self.lines: list[list[str]] = []  # [level, text]
        self._buf = ""
        self._level = "info"
        self.doc: dict[str, Any] = {
            "ok": False,
            "error": None,
            "stage": "start",
            "log": [],
            "memory": [],
            "timings_s": {},
            "llama": {},
            "n_vocab": None,
            "pid": os.getpid(),
        }
        self._nvml: Any = None
        self._nvml_handle: Any = None
        self._cudart: Any = None
        self.keep: list[Any] = []

    # -- output ------------------------------------------------------------------------------

    def save(self) -> None:
        """Write the result document (atomically: temp file, then rename)."""
        self.doc["log"] = [[lvl, text] for lvl, text in self.lines]
        tmp = self.result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f)
        os.replace(tmp, self.result_path)

    def stage(self, name: str) -> None:
        """Enter stage ``name``: note the time, read memory if asked, save."""
        self.doc["stage"] = name
        self.doc["timings_s"][name] = round(time.monotonic() - self.t0, 4)
        if self.spec.get("memory", True):
            self.doc["memory"].append(self.read_memory(name))
        self.save()

    # -- llama.cpp log -----------------------------------------------------------------------

    def on_log(self, level: int, text: bytes | None, _user: Any) -> None:
        """llama_log_set callback: assemble whole lines (CONT continues the previous one)."""
        try:
            if level == LEVEL_DEBUG:
                return
            if level != LEVEL_CONT and not self._buf:
                self._level = LEVEL_NAMES.get(level, str(level))
            self._buf += (text or b"").decode("utf-8", "replace")
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                if line.strip():
                    self.lines.append([self._level, line])
        except Exception:  # never raise into C
            pass

    # -- memory ------------------------------------------------------------------------------

    def init_nvml(self) -> None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._nvml_handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.doc["nvml"] = {
                "name": _text(pynvml.nvmlDeviceGetName(self._nvml_handle)),
                "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            }
        except Exception as exc:
            self._nvml = None
            self.doc["nvml"] = {"error": f"{type(exc).__name__}: {exc}"}

    def init_cudart(self) -> None:
        """Bind cudaMemGetInfo from the libcudart that llama.cpp's CUDA backend loaded (found in
        /proc/self/maps, so it is the same runtime and the same primary context)."""
        path = None
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    if "libcudart.so" in line:
                        path = line.split()[-1]
                        break
        except OSError:
            pass
        if path is None:
            self.doc["cudart"] = None
            return
        try:
            lib = ctypes.CDLL(path)
            lib.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
            lib.cudaMemGetInfo.restype = ctypes.c_int
            self._cudart = lib
            self.doc["cudart"] = path
        except Exception as exc:
            self.doc["cudart"] = f"unusable: {exc}"

    def read_memory(self, name: str) -> dict:
        rec: dict[str, Any] = {
            "stage": name,
            "t_s": round(time.monotonic() - self.t0, 4),
            "rss_bytes": _rss_bytes(),
            "peak_rss_bytes": _peak_rss_bytes(),
        }
        if self._nvml is not None:
            try:
                mi = self._nvml.nvmlDeviceGetMemoryInfo(self._nvml_handle)
                rec["nvml_used_bytes"], rec["nvml_free_bytes"], rec["nvml_total_bytes"] = (
                    int(mi.used),
                    int(mi.free),
                    int(mi.total),
                )
            except Exception as exc:
                rec["nvml_error"] = str(exc)
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._nvml_handle)
                mine = [p for p in procs if int(p.pid) == os.getpid()]
                rec["nvml_processes"] = len(procs)
                rec["nvml_process_bytes"] = (
                    int(mine[0].usedGpuMemory) if mine and mine[0].usedGpuMemory is not None else None
                )
            except Exception as exc:
                rec["nvml_process_error"] = str(exc)
        if self._cudart is not None:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            err = self._cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
            if err == 0:
                rec["cuda_free_bytes"], rec["cuda_total_bytes"] = int(free.value), int(total.value)
            else:
                rec["cuda_error"] = int(err)
        return rec

    # -- the load ------------------------------------------------------------------------------

    def run(self) -> int:
        spec = self.spec
        memory = spec.get("memory", True)
        if memory:
            self.init_nvml()
        self.stage("process_start")
        import llama_cpp as lc

        self._cb = lc.llama_log_callback(self.on_log)
        lc.llama_log_set(self._cb, ctypes.c_void_p(0))
        lc.llama_backend_init()
        ggml = _ggml(lc)
        devices = []
        if ggml is not None:
            for i in range(ggml.ggml_backend_dev_count()):
                dev = ggml.ggml_backend_dev_get(i)
                devices.append(
                    [
                        (ggml.ggml_backend_dev_name(dev) or b"?").decode(),
                        (ggml.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
                    ]
                )
        self.doc["llama"] = {
            "version": getattr(lc, "__version__", "?"),
            "gpu_offload": bool(lc.llama_supports_gpu_offload()),
            "devices": devices,
            "system_info": lc.llama_print_system_info().decode("utf-8", "replace").strip(),
        }
        self.stage("backend_init")  # NVML only: no CUDA context of ours yet
        if memory:
            self.init_cudart()
            if self._cudart is not None:
                self.stage("cuda_context")  # the first cudaMemGetInfo creates the primary context

        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = int(spec.get("n_gpu_layers", -1))
        mp.no_alloc = bool(spec.get("no_alloc", False))
        if "use_extra_bufts" in spec:  # CPU_REPACK / AMX weight buffers (llama.h)
            mp.use_extra_bufts = bool(spec["use_extra_bufts"])
        # no_alloc cannot map (llama-model.cpp GGML_ASSERT(!ml.no_alloc) on mapped buffers)
        mp.load_mode = LOAD_MODE_MMAP if spec.get("use_mmap", True) and not mp.no_alloc else LOAD_MODE_NONE
        overrides = spec.get("overrides") or []
        names = {d[0] for d in devices}
        if overrides and not self.doc["llama"]["gpu_offload"]:
            # a CPU-only build has no CUDA0: llama.cpp keeps everything on the host anyway
            missing = [o for o in overrides if o[1] not in names]
            if missing:
                self.doc["notes"] = [f"override {p}={d} ignored: no {d} in this build" for p, d in missing]
                overrides = [o for o in overrides if o[1] in names]
        if overrides:
            if ggml is None:
                return self.fail("tensor overrides need libggml's device registry, which is unavailable")

            class Override(ctypes.Structure):
                _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

            arr = (Override * (len(overrides) + 1))()
            for i, (pattern, device) in enumerate(overrides):
                dev = ggml.ggml_backend_dev_by_name(device.encode())
                if not dev:
                    return self.fail(f"override device {device} not found (devices: {[d[0] for d in devices]})")
                pat = ctypes.c_char_p(pattern.encode())
                self.keep.append(pat)
                arr[i].pattern = pat
                arr[i].buft = ggml.ggml_backend_dev_buffer_type(dev)
            arr[len(overrides)].pattern = None
            arr[len(overrides)].buft = None
            self.keep.append(arr)
            mp.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p).value
        model = lc.llama_model_load_from_file(spec["model"].encode(), mp)
        if not model:
            return self.fail("llama_model_load_from_file returned NULL")
        self.stage("model_loaded")

        c = spec.get("ctx") or {}
        cp = lc.llama_context_default_params()
        cp.n_ctx = int(c.get("n_ctx", 4096))
        cp.n_batch = int(c.get("n_batch", 2048))
        cp.n_ubatch = min(int(c.get("n_ubatch", 512)), cp.n_batch)
        cp.n_seq_max = int(c.get("n_seq_max", 1))
        threads = int(c.get("n_threads") or max(1, (os.cpu_count() or 2) // 2))
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = GGML_TYPES[c.get("type_k", "f16")]
        cp.type_v = GGML_TYPES[c.get("type_v", "f16")]
        cp.flash_attn_type = FLASH_ATTN[c.get("flash_attn", "auto")]
        cp.offload_kqv = bool(c.get("offload_kqv", True))
        cp.swa_full = bool(c.get("swa_full", False))
        cp.kv_unified = bool(c.get("kv_unified", False))
        if "op_offload" in c:  # --no-op-offload (llama.h llama_context_params.op_offload)
            cp.op_offload = bool(c["op_offload"])
        cp.no_perf = True
        ctx = lc.llama_init_from_model(model, cp)
        if not ctx:
            lc.llama_model_free(model)
            return self.fail("llama_init_from_model returned NULL")
        self.stage("context_created")

        vocab = lc.llama_model_get_vocab(model)
        n_vocab = int(lc.llama_vocab_n_tokens(vocab))
        self.doc["n_vocab"] = n_vocab
        ex = spec.get("exercise")
        bench = spec.get("bench")
        if bench and not mp.no_alloc and n_vocab > 0:
            self.bench(lc, ctx, cp, n_vocab, bench)
        elif ex and not mp.no_alloc and n_vocab > 0:
            rng = random.Random(1)
            n = max(1, min(int(ex.get("n_prompt", 512)), cp.n_ctx - 8, cp.n_batch))
            toks = (lc.llama_token * n)(*[rng.randrange(n_vocab) for _ in range(n)])
            t = time.monotonic()
            ret = lc.llama_decode(ctx, lc.llama_batch_get_one(toks, n))
            lc.llama_synchronize(ctx)
            self.doc["timings_s"]["prefill_batch"] = round(time.monotonic() - t, 4)
            self.doc["prefill_tokens"] = n
            if ret != 0:
                self.stage("prefill_failed")
                self.doc["error"] = f"llama_decode of {n} tokens returned {ret}"
            else:
                self.stage("after_prefill")
                for _ in range(int(ex.get("n_gen", 1))):
                    one = (lc.llama_token * 1)(rng.randrange(n_vocab))
                    t = time.monotonic()
                    ret = lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1))
                    lc.llama_synchronize(ctx)
                    self.doc["timings_s"]["decode_token"] = round(time.monotonic() - t, 4)
                    if ret != 0:
                        self.doc["error"] = f"llama_decode of 1 token returned {ret}"
                        break
                self.stage("after_decode")
        lc.llama_free(ctx)
        self.stage("context_freed")
        lc.llama_model_free(model)
        self.doc["ok"] = self.doc["error"] is None
        self.stage("model_freed")
        return 0 if self.doc["ok"] else 1

    def bench(self, lc: Any, ctx: Any, cp: Any, n_vocab: int, bench: dict) -> None:
        """Timed prefill and decode at several depths in one context (the offload sweep):
        ``{"depths": [0, 8192, 32768], "n_prompt": 4096, "n_gen": 32}``. At each depth (in
        increasing order) the cache is first filled to it with untimed random tokens (timed apart
        as ``fill``), then ``n_prompt`` tokens are decoded in ``n_batch`` chunks (prefill, timed),
        then ``n_gen`` single tokens (decode, timed); the cache is cleared before the next depth.
        Results in ``doc["bench"]``: one record per depth with ``prefill_tok_s`` and
        ``decode_tok_s`` (median of the single-token times), or ``error``."""
        rng = random.Random(2)
        n_prompt, n_gen = int(bench.get("n_prompt", 512)), int(bench.get("n_gen", 32))
        out: list[dict] = []
        self.doc["bench"] = out
        mem = lc.llama_get_memory(ctx) if hasattr(lc, "llama_get_memory") else None

        def feed(n: int) -> tuple[float, int]:
            t, done = time.monotonic(), 0
            while done < n:
                k = min(cp.n_batch, n - done)
                toks = (lc.llama_token * k)(*[rng.randrange(n_vocab) for _ in range(k)])
                ret = lc.llama_decode(ctx, lc.llama_batch_get_one(toks, k))
                if ret != 0:
                    return time.monotonic() - t, ret
                done += k
            lc.llama_synchronize(ctx)
            return time.monotonic() - t, 0

        for depth in sorted(int(d) for d in bench.get("depths", [0])):
            rec: dict[str, Any] = {"depth": depth, "n_prompt": n_prompt, "n_gen": n_gen}
            out.append(rec)
            if depth + n_prompt + n_gen + 8 > cp.n_ctx:
                rec["error"] = f"depth {depth} + {n_prompt} + {n_gen} tokens exceed n_ctx {cp.n_ctx}"
                continue
            if mem is not None:
                lc.llama_memory_clear(mem, True)
            if depth:
                t_fill, ret = feed(depth)
                rec["fill_s"] = round(t_fill, 3)
                if ret:
                    rec["error"] = f"llama_decode while filling to depth {depth} returned {ret}"
                    break
            t_pre, ret = feed(n_prompt)
            if ret:
                rec["error"] = f"llama_decode of the prompt returned {ret}"
                break
            rec["prefill_s"] = round(t_pre, 4)
            rec["prefill_tok_s"] = round(n_prompt / t_pre, 2) if t_pre > 0 else None
            times = []
            for _ in range(n_gen):
                one = (lc.llama_token * 1)(rng.randrange(n_vocab))
                t = time.monotonic()
                ret = lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1))
                lc.llama_synchronize(ctx)
                times.append(time.monotonic() - t)
                if ret != 0:
                    rec["error"] = f"llama_decode of 1 token returned {ret}"
                    break
            if times:
                times.sort()
                rec["decode_tok_s"] = round(1.0 / times[len(times) // 2], 3)
            self.stage(f"bench_d{depth}")
            if rec.get("error"):
                break

    def fail(self, message: str) -> int:
        errors = [text for lvl, text in self.lines if lvl == "error"]
        self.doc["error"] = message + (f": {errors[-1]}" if errors else "")
        self.stage("failed")
        return 1


def _ggml(lc: Any) -> Any:
    """libggml through ctypes (it ships next to libllama in llama-cpp-python), or None."""
    try:
        try:
            from llama_cpp._ggml import libggml as lib  # type: ignore[attr-defined]
        except Exception:
            from pathlib import Path

            lib = ctypes.CDLL(str(Path(lc.__file__).parent / "lib" / "libggml.so"))
        vp = ctypes.c_void_p
        for name, res, args in (
            ("ggml_backend_dev_count", ctypes.c_size_t, []),
            ("ggml_backend_dev_get", vp, [ctypes.c_size_t]),
            ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
            ("ggml_backend_dev_by_name", vp, [ctypes.c_char_p]),
            ("ggml_backend_dev_buffer_type", vp, [vp]),
        ):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        return lib
    except Exception:
        return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: probe.py SPEC.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    probe = Probe(spec, argv[2])
    try:
        rc = probe.run()
    except Exception as exc:  # report, do not hide: the parent records it as the row's error
        probe.doc["error"] = f"{type(exc).__name__}: {exc}"
        probe.save()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # no C++ static destructors racing llama.cpp's threads


if __name__ == "__main__":
    sys.exit(main(sys.argv))
