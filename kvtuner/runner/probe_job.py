"""The CPU probe as a background job: a detached process (``python -m kvtuner.runner.probe_job``)
that runs :func:`kvtuner.runner.probe.run_cpu_probe`, reports its progress in a status file and
stores the result when it is done, so a one-shot CLI command answers at once from assumed rates
and exits without leaving a child behind.

Why a detached process rather than a CLI that keeps probing after its answer: a user (or a
script: ``kvtuner plan --json | jq``) expects the command to end when its answer is printed; a
detached job frees the shell, and the next command reads the status file and says how far the
probe is (kernel k of n, elapsed seconds) or uses its result.

Files in the data directory (:func:`kvtuner.core.paths.data_dir`):

- ``cpu-probe.lock``: held (``fcntl.flock``, exclusive) for the whole job, so two probes never run
  at once (they would slow each other and both read busy);
- ``cpu-probe.json``: ``state`` (``running``, ``stored``, ``busy``, ``failed``), ``pid``, ``k`` of
  ``n`` probe models, ``key``, ``elapsed_s``, ``message``, ``t_unix``;
- ``cpu-probe.log``: the job's stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Seconds one probe model takes on a quiet 2-core machine at 2 threads (overhead, attention and
#: matrix probes: 15-35 s for the overhead probes, one attention shape and two weight types), and
#: an expert probe (hundreds of MB of experts).
EST_MODEL_S, EST_EXPERT_S = 6.0, 40.0
#: After a probe that met a busy machine or failed, a background probe is not started again for
#: this long, seconds (each would meet the same load); ``--probe now`` still runs one.
RETRY_AFTER_S = 15 * 60.0
#: Weight types and attention shapes (f16 K/V) the first probe measures beside the model's own, so
#: the common GGUF models (Llama 3 8B, Qwen2.5/Qwen3, Gemma 3, Mistral, gpt-oss) need no new wait:
#: the K-quants, Q8_0, Q4_0, F16 and MXFP4; 32/8/128 (Llama 3, Mistral), 32/4/128 (Qwen3-30B-A3B),
#: 28/4/128 (Qwen2.5-7B), 64/8/64 (gpt-oss).
COMMON_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "F16", "MXFP4")
COMMON_ATTN = ("32/8/128", "32/4/128", "28/4/128", "64/8/64")


def _dir() -> Path:
    from ..core.paths import data_dir

    return data_dir()


def status_path() -> Path:
    """``cpu-probe.json`` in the data directory."""
    return _dir() / "cpu-probe.json"


def lock_path() -> Path:
    """``cpu-probe.lock`` in the data directory."""
    return _dir() / "cpu-probe.lock"


def read_status() -> dict[str, Any]:
    """The last job's status (``{}`` when there is none or it cannot be read)."""
    try:
        d = json.loads(status_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _write_status(**fields: Any) -> None:
    from ..core.fileio import replace_atomic

    try:
        replace_atomic(status_path(), json.dumps({**fields, "t_unix": time.time()}))
    except OSError:
        pass


def is_running() -> bool:
    """Whether a probe job holds the lock now."""
    try:
        import fcntl
    except ImportError:  # no flock: the status file's word
        return read_status().get("state") == "running"
    try:
        fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def estimate_s(n_models: int, n_experts: int) -> float:
    """Seconds a probe of ``n_models`` probe models, ``n_experts`` of them expert probes, takes on a
    quiet machine (:data:`EST_MODEL_S`, :data:`EST_EXPERT_S`)."""
    return (n_models - n_experts) * EST_MODEL_S + n_experts * EST_EXPERT_S


def estimate_text(n_models: int, n_experts: int) -> str:
    """``"about 90 s on a quiet machine"``, and when the 1-minute load average is over half the
    cores, that this machine is not quiet: a probe then takes several times longer and, measuring
    the other load, is not kept (:class:`~kvtuner.core.monitor.contention.Contention`)."""
    text = f"about {estimate_s(n_models, n_experts):.0f} s on a quiet machine"
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return text
    if load > 0.5 * cores:
        text += (
            f"; this one is busy (load average {load:.1f} on {cores} cores): it will take longer, and a probe "
            "that meets other load is not kept"
        )
    return text


def progress_text(st: dict[str, Any]) -> str:
    """``"kernel 3 of 12 (matrix:Q4_K), 41 s"`` from a running job's status."""
    return f"kernel {st.get('k', 0)} of {st.get('n', '?')} ({st.get('key', '')}), {st.get('elapsed_s', 0):.0f} s"


def start_background(
    types: Sequence[str],
    n_threads: int,
    attn: Sequence[str],
    experts: Sequence[str],
    *,
    machine: str = "",
    record_anyway: bool = False,
) -> int:
    """Start the detached job (its own session, no terminal, stderr to ``cpu-probe.log``) storing
    under ``machine`` (the session's :func:`~kvtuner.core.hardware.identity.machine_id`); returns its pid.

    Raises:
        OSError: it cannot be started.
    """
    _dir().mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "kvtuner.runner.probe_job",
        "-t",
        str(n_threads),
        "--types",
        ",".join(types),
        "--attn",
        ",".join(attn),
        "--experts",
        ",".join(experts),
        "--machine",
        machine,
    ]
    if record_anyway:
        cmd.append("--record-anyway")
    with open(_dir() / "cpu-probe.log", "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, close_fds=True
        )
    _write_status(state="starting", pid=proc.pid, k=0, n=0, key="", elapsed_s=0.0, message="")
    return proc.pid


def probe_missing(
    session: Any, kv_pairs: Sequence[tuple[str, str]] = ()
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """What this machine's stored probe lacks for the session's model
    (:meth:`~kvtuner.core.session.Session.missing_probe`: weight types, attention shapes, expert
    shapes), or ``((), (), ())`` when nothing is needed: no model, a configuration the plan
    refuses, or a plan that computes nothing on the CPU (every weight and the KV on GPUs)."""
    if session.model is None:
        return (), (), ()
    try:
        plan = session.plan()
    except Exception:  # the caller reports the configuration error itself
        return (), (), ()
    if not (plan.host.weights_bytes > plan.model.input_bytes or plan.host.kv_bytes):
        return (), (), ()
    return session.missing_probe(kv_pairs)


def background_for(
    session: Any, missing: Sequence[str], dims: Sequence[str], experts: Sequence[str], *, record_anyway: bool = False
) -> str:
    """Start (unless one runs, or one that met a busy machine or failed ended within
    :data:`RETRY_AFTER_S`) the background job for ``missing`` weight types, ``dims`` attention
    shapes and ``experts`` expert shapes plus the common kernels (:data:`COMMON_TYPES`,
    :data:`COMMON_ATTN`) at the session's threads; returns a line for the user saying what
    happens (the answer meanwhile uses assumed CPU rates)."""
    from ..core.speed.cpu_probe import probe_plan

    if is_running():
        return (
            f"the CPU probe is running in the background ({progress_text(read_status())}); this answer uses "
            "assumed CPU rates, the next command the measured ones (--probe now waits for it)"
        )
    st = read_status()
    if st.get("state") in ("busy", "failed") and time.time() - float(st.get("t_unix", 0)) < RETRY_AFTER_S:
        return (
            f"the last CPU probe was not kept ({st.get('message', '')}); the speed uses assumed CPU rates "
            "(--probe now measures again now)"
        )
    n = session.probe_threads()
    types = sorted({*missing, *COMMON_TYPES})
    attn = sorted({*dims, *COMMON_ATTN})
    models = probe_plan(types, attn, experts)
    est = estimate_text(len(models), sum(1 for m in models if m.key.startswith("expert:")))
    try:
        pid = start_background(types, n, attn, experts, machine=session.machine_id, record_anyway=record_anyway)
    except OSError as exc:
        return f"no CPU probe ({exc}); the speed uses assumed CPU rates"
    return (
        f"this answer uses assumed CPU rates; timing llama.cpp's CPU kernels in the background "
        f"(pid {pid}: {len(models)} kernels at {n} thread{'s' if n != 1 else ''}, once a week; {est}); "
        "the next command uses them (--probe now waits, --probe off skips)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one probe job (see the module docstring); exit 0 when stored, 3 when another job holds
    the lock, 4 when the machine was busy, 1 when the probe failed."""
    p = argparse.ArgumentParser(prog="python -m kvtuner.runner.probe_job", allow_abbrev=False)
    p.add_argument("-t", type=int, required=True)
    p.add_argument("--types", default="")
    p.add_argument("--attn", default="")
    p.add_argument("--experts", default="")
    p.add_argument("--record-anyway", action="store_true")
    p.add_argument("--machine", default="")
    a = p.parse_args(argv)
    import fcntl

    from ..core.speed.calibration import BusyMeasurementError, CalibrationError, CalibrationStore
    from ..core.speed.cpu_probe import BusyProbeError, ProbeError
    from .probe import run_cpu_probe

    _dir().mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 3
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    pid = os.getpid()

    def progress(k: int, n: int, key: str, elapsed_s: float) -> None:
        _write_status(state="running", pid=pid, k=k, n=n, key=key, elapsed_s=elapsed_s, message="")

    t0 = time.monotonic()
    try:
        rates = run_cpu_probe(
            split(a.types),
            a.t,
            attn_shapes=split(a.attn) or ["32/8/128"],
            expert_keys=split(a.experts),
            on_progress=progress,
            stop_when_busy=not a.record_anyway,
        )
        CalibrationStore().set_cpu_rates(rates, a.machine or None, record_anyway=a.record_anyway)
        _write_status(state="stored", pid=pid, elapsed_s=time.monotonic() - t0, message="")
    except (BusyMeasurementError, BusyProbeError) as exc:
        _write_status(state="busy", pid=pid, elapsed_s=time.monotonic() - t0, message=str(exc))
        return 4
    except (ProbeError, CalibrationError) as exc:
        _write_status(state="failed", pid=pid, elapsed_s=time.monotonic() - t0, message=str(exc))
        return 1
    finally:
        os.close(fd)  # releases the lock
    return 0


if __name__ == "__main__":
    sys.exit(main())
