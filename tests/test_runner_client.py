"""The runner child for real: events, errors, faults, cancel, and no leaked processes.

Every test uses a real ``python -m kvtuner.runner`` child and the real llama.cpp; faults are
triggered with the worker's test hook (``KVTUNER_RUNNER_FAULT``) or real signals.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner import protocol as P
from kvtuner.runner.client import RunnerClient, RunnerError
from kvtuner.runner.worker import FAULT_ENV
from kvtuner.testing.processes import wait_until_ignoring

pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python"),
]

SMALL = PlanConfig(n_ctx=512, n_batch=512)


def gone(pid: int) -> bool:
    """The process no longer runs (reaped, or a zombie of someone else's)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def runner():
    """Start runner children (optionally with a fault) and make sure each is gone after."""
    clients: list[RunnerClient] = []

    def make(fault: str | None = None, start: bool = True) -> RunnerClient:
        c = RunnerClient(env={FAULT_ENV: fault} if fault else None)
        clients.append(c)
        if start:
            c.start(timeout_s=60)
        return c

    yield make
    for c in clients:
        c.close(timeout_s=5)
        if c.pid is None:
            continue
        assert wait_gone(c.pid), f"runner {c.pid} leaked"
        try:
            status = psutil.Process(c.pid).status()
        except psutil.NoSuchProcess:
            continue  # reaped
        assert status != psutil.STATUS_ZOMBIE, f"runner {c.pid} left a zombie"


def load(c: RunnerClient, model, config: PlanConfig = SMALL, **kw) -> tuple[P.LoadedEvent, list[P.Message]]:
    seen: list[P.Message] = []
    ev = c.request(
        P.LoadCommand(model_path=str(model), config=config.to_dict(), n_threads=kw.pop("n_threads", None)),
        P.LoadedEvent,
        timeout_s=kw.pop("timeout_s", 60),
        on_other=seen.append,
    )
    assert isinstance(ev, P.LoadedEvent)
    return ev, seen


def next_of(c: RunnerClient, kind: type, timeout_s: float = 30) -> P.Message:
    return c.wait_for(kind, timeout_s=timeout_s)


# -- normal operation ------------------------------------------------------------------------


def test_started_event(runner):
    c = runner()
    st = c.started
    assert isinstance(st, P.StartedEvent)
    assert st.pid == c.pid and st.protocol_version == P.PROTOCOL_VERSION
    assert "CPU" in st.devices and len(st.device_descriptions) == len(st.devices)
    assert isinstance(st.gpu_offload_supported, bool)
    assert st.llama_build.startswith("llama-cpp-python")


def test_load_bench_unload_events(runner, default_model):
    c = runner()
    loaded, seen = load(c, default_model, n_threads=1)
    progress = [e.progress for e in seen if isinstance(e, P.LoadProgressEvent)]
    assert progress and progress == sorted(progress) and progress[-1] == 1.0
    kinds = {(e.buffer.kind, e.buffer.buft) for e in seen if isinstance(e, P.BufferEvent)}
    assert ("compute", "CPU") in kinds and ("output", "CPU") in kinds and any(k == "model" for k, _ in kinds)
    caches = [e for e in seen if isinstance(e, P.KvCacheEvent)]
    assert [(e.cache.cells, e.cache.layers) for e in caches] == [(512, 3), (512, 15)]
    ctx = next(e for e in seen if isinstance(e, P.ContextEvent))
    assert ctx.n_ctx == 512 and ctx.flash_attn in (True, False)
    assert any(isinstance(e, P.LogEvent) for e in seen)
    assert loaded.n_layer == 18 and loaded.n_vocab == 262144 and loaded.n_threads == 1
    assert 0 < loaded.load_s < 60 and loaded.load_s == pytest.approx(loaded.load_model_s + loaded.create_context_s)

    events: list[P.Message] = []
    res = c.request(
        P.BenchCommand(n_prompt=16, n_gen=4, repetitions=1, warmup=False),
        P.BenchResultEvent,
        timeout_s=120,
        on_other=events.append,
    )
    assert isinstance(res, P.BenchResultEvent)
    tokens = [e for e in events if isinstance(e, P.TokenEvent)]
    assert [t.index for t in tokens] == [0, 1, 2, 3]
    assert all(t.dt_s > 0 and 0 <= t.token < 262144 for t in tokens)
    assert [t.t_s for t in tokens] == sorted(t.t_s for t in tokens)
    assert any(isinstance(e, P.PrefillProgressEvent) and e.n_done == 16 for e in events)
    pre = next(e for e in events if isinstance(e, P.PrefillResultEvent))
    assert pre.n_tokens == 16 and pre.prefill_s > 0 and pre.tok_s == pytest.approx(16 / pre.prefill_s)
    (rep,) = res.reps
    assert isinstance(rep, P.Repetition)
    assert rep.n_prompt == 16 and rep.n_gen == 4 and rep.ttft_s >= rep.prefill_s > 0
    assert rep.decode_tok_s == pytest.approx(4 / rep.decode_s)
    assert res.peak_rss_bytes > 200 << 20  # the weights are mapped and touched
    assert res.perf["n_eval"] >= 4

    assert isinstance(c.request(P.UnloadCommand(), P.UnloadedEvent, timeout_s=30), P.UnloadedEvent)
    assert c.close() == 0, c.stderr_tail()
    exited = [e for e in drain(c) if isinstance(e, P.ExitedEvent)]
    assert exited == [P.ExitedEvent(returncode=0, signal_name="", requested=True)]


def drain(c: RunnerClient) -> list[P.Message]:
    out = []
    while True:
        try:
            out.append(c.next_event(0.2))
        except RunnerError:
            return out


def test_bench_without_a_model(runner):
    c = runner()
    with pytest.raises(RunnerError, match="no model loaded") as ei:
        c.request(P.BenchCommand(), P.BenchResultEvent, timeout_s=10)
    assert ei.value.kind == "invalid_config"


def test_bench_larger_than_the_context(runner, default_model):
    c = runner()
    load(c, default_model, PlanConfig(n_ctx=256))
    with pytest.raises(RunnerError, match=r"needs 640 tokens of context .* holds 256: raise --ctx") as ei:
        c.request(P.BenchCommand(n_prompt=512, n_gen=128), P.BenchResultEvent, timeout_s=10)
    assert ei.value.kind == "invalid_config"


# -- bad input -------------------------------------------------------------------------------


def test_missing_model(runner, tmp_path):
    c = runner()
    with pytest.raises(RunnerError, match="model file not found") as ei:
        load(c, tmp_path / "missing.gguf")
    assert ei.value.kind == "model_error"
    assert c.alive  # the child serves on


def test_not_a_model(runner, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    c = runner()
    with pytest.raises(RunnerError, match=f"cannot load model {bad}") as ei:
        load(c, bad)
    assert ei.value.kind == "model_error"


def test_bad_config_dict(runner, default_model):
    c = runner()
    with pytest.raises(RunnerError, match="unknown configuration keys: bogus") as ei:
        c.request(P.LoadCommand(model_path=str(default_model), config={"bogus": 1}), P.LoadedEvent, timeout_s=10)
    assert ei.value.kind == "invalid_config"


def test_garbage_command_line(runner):
    c = runner()
    c.send_raw(b"this is not json\n")
    ev = c.next_event(10)
    assert isinstance(ev, P.ErrorEvent) and ev.kind == "protocol_error" and "bad command line" in ev.message
    c.send_raw(b'{"v": 2, "type": "load"}\n')
    ev = c.next_event(10)
    assert isinstance(ev, P.ErrorEvent) and ev.kind == "protocol_error" and "protocol version 2" in ev.message
    # still serving
    with pytest.raises(RunnerError, match="no model loaded"):
        c.request(P.BenchCommand(), P.BenchResultEvent, timeout_s=10)


def test_garbage_from_the_child(runner):
    c = runner("garbage@started", start=False)
    with pytest.raises(RunnerError, match="garbage from the runner") as ei:
        c.start(timeout_s=60)
    assert ei.value.kind == "protocol_error"
    assert wait_gone(c.pid)


# -- crashes ---------------------------------------------------------------------------------


def test_abort_mid_load(runner, default_model):
    c = runner("abort@load_progress")
    with pytest.raises(RunnerError, match=r"crashed \(SIGABRT\)") as ei:
        load(c, default_model)
    assert ei.value.kind == "crashed"
    exited = next_of(c, P.ExitedEvent)
    assert exited.returncode == -signal.SIGABRT and exited.signal_name == "SIGABRT" and not exited.requested
    assert c.returncode == -signal.SIGABRT


def test_ggml_abort_in_llama_cpp(runner, default_model):
    c = runner("ggml_abort@context")
    with pytest.raises(RunnerError) as ei:
        load(c, default_model)
    assert ei.value.kind == "crashed"
    # ggml_abort prints "<file>:<line>: fatal error" on stderr; the message quotes the last line
    text = str(ei.value) + "\n".join(ei.value.log_tail)
    assert "SIGABRT" in str(ei.value) and "fatal error" in text


@pytest.mark.parametrize(
    "sig, kind", [(signal.SIGKILL, "out_of_memory"), (signal.SIGSEGV, "crashed"), (signal.SIGTERM, "crashed")]
)
def test_killed_mid_load(runner, default_model, sig, kind):
    c = runner("hang@load_progress")
    c.send(P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict()))
    next_of(c, P.LoadProgressEvent)  # it is loading (and stuck in the progress callback)
    os.kill(c.pid, sig)
    with pytest.raises(RunnerError) as ei:
        next_of(c, P.LoadedEvent)
    assert ei.value.kind == kind
    if sig == signal.SIGKILL:
        assert "OOM killer" in str(ei.value)
    assert next_of(c, P.ExitedEvent).returncode == -sig


def _overcommit_heuristic() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "0"
    except OSError:
        return False


@pytest.mark.skipif(not _overcommit_heuristic(), reason="needs Linux's heuristic overcommit (vm.overcommit_memory=0)")
def test_real_allocation_failure_is_out_of_memory(runner, default_model):
    # an f32 KV cache 4x larger than RAM + swap: the kernel refuses the malloc at once
    # (heuristic overcommit), ggml logs "insufficient memory", llama.cpp gives up the context
    ram = psutil.virtual_memory().total + psutil.swap_memory().total
    n_ctx = (4 * ram // (3 * 256 * 4 * 2) // 256 + 1) * 256  # 3 global layers x 256 x f32 x (K, V)
    c = runner()
    with pytest.raises(RunnerError, match="out of memory while creating the context") as ei:
        load(c, default_model, PlanConfig(n_ctx=n_ctx, type_k="f32", type_v="f32", flash_attn="on"))
    assert ei.value.kind == "out_of_memory"
    assert any("failed to allocate" in line for line in ei.value.log_tail)
    assert c.alive  # a refused allocation does not kill the child


def test_oom_killer_stand_in(runner, default_model):
    c = runner("sigkill@load_progress")
    with pytest.raises(RunnerError, match="killed by SIGKILL") as ei:
        load(c, default_model)
    assert ei.value.kind == "out_of_memory"


def test_unexpected_exit(runner, default_model):
    c = runner("exit@context")
    with pytest.raises(RunnerError, match="exited unexpectedly with status 7") as ei:
        load(c, default_model)
    assert ei.value.kind == "crashed"


# -- timeouts and cancel ---------------------------------------------------------------------


def test_timeout_never_hangs(runner, default_model):
    c = runner("hang@load_progress")
    t0 = time.monotonic()
    with pytest.raises(RunnerError, match="did not finish within 2 s") as ei:
        c.request(P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict()), P.LoadedEvent, timeout_s=2)
    assert ei.value.kind == "timeout" and time.monotonic() - t0 < 5
    pid = c.pid
    t0 = time.monotonic()
    c.close(timeout_s=5)  # the hung child leaves on stdin EOF
    assert time.monotonic() - t0 < 5 and wait_gone(pid)


def test_idle_timeout(runner, default_model):
    c = runner("hang@load_progress")
    with pytest.raises(RunnerError, match="went silent for 1 s"):
        c.request(
            P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict()),
            P.LoadedEvent,
            timeout_s=60,
            idle_timeout_s=1,
        )


def test_polite_cancel_mid_bench(runner, default_model):
    c = runner()
    load(c, default_model, PlanConfig(n_ctx=1024), n_threads=1)
    c.send(P.BenchCommand(n_prompt=0, n_gen=1000, repetitions=1, warmup=False))
    next_of(c, P.TokenEvent, timeout_s=60)
    assert c.cancel(grace_s=30) == "polite"
    with pytest.raises(RunnerError, match="benchmark cancelled") as ei:
        next_of(c, P.BenchResultEvent)
    assert ei.value.kind == "cancelled"
    assert c.alive
    assert c.cancel() == "idle"
    # the model is still loaded and the child still serves
    res = c.request(P.BenchCommand(n_prompt=0, n_gen=2, repetitions=1, warmup=False), P.BenchResultEvent, timeout_s=60)
    assert res.reps[0].n_gen == 2


def test_polite_cancel_mid_load(runner, default_model):
    # the load stalls in its progress callback until cancelled; the callback then returns
    # false and llama.cpp abandons the load ("cancelled model load")
    c = runner("stall@load_progress")
    c.send(P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict()))
    next_of(c, P.LoadProgressEvent)
    assert c.cancel(grace_s=10) == "polite"
    with pytest.raises(RunnerError, match="model load cancelled") as ei:
        next_of(c, P.LoadedEvent)
    assert ei.value.kind == "cancelled"
    loaded, _ = load(c, default_model)  # and it can load again
    assert loaded.n_layer == 18


def test_cancel_when_idle_is_ignored(runner, default_model):
    c = runner()
    c.send(P.CancelCommand())
    assert c.cancel() == "idle"
    loaded, _ = load(c, default_model)
    assert loaded.n_layer == 18


def test_cancel_escalates_to_sigterm(runner, default_model):
    c = runner("hang@load_progress")
    c.send(P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict()))
    next_of(c, P.LoadProgressEvent)
    t0 = time.monotonic()
    assert c.cancel(grace_s=0.5, term_grace_s=5) == "terminated"
    assert time.monotonic() - t0 < 5
    with pytest.raises(RunnerError, match="stopped") as ei:
        next_of(c, P.LoadedEvent)
    assert ei.value.kind == "cancelled"
    exited = next_of(c, P.ExitedEvent)
    assert exited.requested and exited.signal_name == "SIGTERM"


def test_cancel_escalates_to_sigkill(runner, default_model):
    c = runner("deaf@load_progress")
    c.send(P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict()))
    next_of(c, P.LoadProgressEvent)
    wait_until_ignoring(c.pid)  # the child ignores SIGTERM from here on
    assert c.cancel(grace_s=0.3, term_grace_s=0.5) == "killed"
    with pytest.raises(RunnerError) as ei:
        next_of(c, P.LoadedEvent)
    assert ei.value.kind == "cancelled"  # we killed it: not mistaken for the OOM killer
    assert next_of(c, P.ExitedEvent).returncode == -signal.SIGKILL


# -- the parent dies -------------------------------------------------------------------------

PARENT = textwrap.dedent(
    """
    import os, sys, time
    from kvtuner.runner.client import RunnerClient
    from kvtuner.runner import protocol as P
    c = RunnerClient(env={"KVTUNER_RUNNER_FAULT": "hang@load_progress"})
    c.start(timeout_s=60)
    c.send(P.LoadCommand(model_path=sys.argv[1], config={"n_ctx": 512}))
    c.wait_for(P.LoadProgressEvent, timeout_s=60)
    print(c.pid, flush=True)
    sys.stdin.readline()  # the test has seen the child alive (else os._exit races its check)
    if sys.argv[2] == "exit":
        os._exit(0)       # no cleanup at all
    time.sleep(600)       # to be SIGKILLed
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_child_goes_away_when_the_parent_dies(default_model, how):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(default_model), how],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        line = parent.stdout.readline()
        child_pid = int(line)
        assert not gone(child_pid)
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        if how == "sigkill":
            parent.kill()
        parent.wait(timeout=30)
        assert wait_gone(child_pid, timeout_s=10), "the runner outlived its parent"
    finally:
        parent.kill()
        parent.wait()
