"""Run the CPU probe (:mod:`kvtuner.core.speed.cpu_probe`) in one runner child: write the probe
models (sparse, a few KiB each) to a temporary directory, then for each load it, bench it (a
warm-up pass, then the best of ``repetitions``), unload it. The child sees no GPU
(``CUDA_VISIBLE_DEVICES`` empty): it measures the CPU's kernels only.

Takes about 10-25 s on an idle 2-core machine for a model of two weight types; the result is
stored per machine and thread count by :class:`kvtuner.core.speed.calibration.CalibrationStore`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ..core.plan.config import PlanConfig
from ..core.speed.cpu_probe import CpuRates, ProbeError, ProbeRun, probe_plan, rates_from_runs, write_probe_model
from . import protocol as P
from .client import RunnerClient, RunnerError


def run_cpu_probe(weight_types: Sequence[str], n_threads: int, *, head_dims: Sequence[int] = (128,),
                  kv_type: str = "f16", repetitions: int = 2, timeout_s: float = 600.0,
                  on_step: Callable[[str], None] | None = None) -> CpuRates:
    """Probe this machine's CPU for ``weight_types`` (ggml type names) and attention ``head_dims``
    at ``n_threads`` threads.

    ``on_step`` is told each probe model's key before it runs (progress for the user).

    Raises:
        ProbeError: the child failed (its reason in the message), or the runs were unusable.
    """
    models = probe_plan(weight_types, head_dims)
    runs: list[ProbeRun] = []
    with tempfile.TemporaryDirectory(prefix="kvtuner-probe-") as tmp:
        client = RunnerClient(env={"CUDA_VISIBLE_DEVICES": ""})
        try:
            client.start(timeout_s=120.0)
            for m in models:
                if on_step is not None:
                    on_step(m.key)
                path = write_probe_model(Path(tmp) / f"{m.key.replace(':', '-')}.gguf", m)
                cfg = PlanConfig(n_ctx=m.n_ctx, n_gpu_layers=0, type_k=kv_type, type_v=kv_type, flash_attn="on",
                                 n_batch=512, n_ubatch=512)
                client.request(P.LoadCommand(model_path=os.fspath(path), config=cfg.to_dict(), n_threads=n_threads),
                               P.LoadedEvent, timeout_s=timeout_s, idle_timeout_s=timeout_s)
                for depth, n_prompt, n_gen in m.runs:
                    res = client.request(P.BenchCommand(n_prompt=n_prompt, n_gen=n_gen, n_depth=depth,
                                                        repetitions=repetitions), P.BenchResultEvent,
                                         timeout_s=timeout_s, idle_timeout_s=timeout_s)
                    assert isinstance(res, P.BenchResultEvent)
                    reps = [P.Repetition.of(r) for r in res.reps]
                    runs.append(ProbeRun(m.key, depth, n_prompt, min(r.prefill_s for r in reps), n_gen,
                                         min(r.decode_s for r in reps) if n_gen else 0.0))
                client.request(P.UnloadCommand(), P.UnloadedEvent, timeout_s=60.0)
        except RunnerError as exc:
            raise ProbeError(f"the CPU probe failed ({exc.kind}): {exc.message}") from None
        finally:
            client.close(timeout_s=5.0)
    return rates_from_runs(runs, n_threads, kv_type=kv_type, load_avg=os.getloadavg()[0])
