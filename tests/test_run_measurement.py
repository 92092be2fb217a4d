"""One run, one measurement: ``kvtuner bench`` and the window's run handling fold the runner's
events through one :class:`~kvtuner.core.monitor.measurement.RunRecorder` into the same
:class:`~kvtuner.core.speed.measurement.Measurement` and the same decision (what it may calibrate
and enter), and a busy machine keeps the run out of calibration in both.

The event stream is a real one: ``kvtuner bench`` runs the embedded default model once in this
process (the events its ``run_bench`` hands it are kept), and the window is handed that same
stream; the busy case replays it to both while real busy loops run beside them."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvtuner.core.monitor.contention import QUIET_LIMIT_ENV, QUIET_MAX_OTHER_CORES, Contention
from kvtuner.core.monitor.measurement import RunRecorder, keep_of
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.speed.calibration import BusyMeasurementError, CalibrationError, CalibrationStore
from kvtuner.core.speed.measurement import Keep, Measurement, Repetition
from kvtuner.runner import protocol as P
from kvtuner.runner.bench import record_event

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")

#: the bench both sides measure: 32 prompt and 8 generated tokens, 2 repetitions, 1 thread
N_PROMPT, N_GEN, REPS = 32, 8, 2
BENCH = [
    "bench",
    "--engine",
    "embedded",
    "--ctx",
    "512",
    "-p",
    str(N_PROMPT),
    "-n",
    str(N_GEN),
    "-r",
    str(REPS),
    "-t",
    "1",
    "--json",
]


def _rep(i: int, prefill_s: float, decode_s: float) -> Repetition:
    return Repetition(
        rep=i, n_depth=0, n_prompt=N_PROMPT, prefill_s=prefill_s, n_gen=N_GEN, decode_s=decode_s, ttft_s=prefill_s
    )


def test_the_recorder_folds_the_runners_events_into_medians():
    """The runner's own protocol events through :func:`record_event`: medians over the
    repetitions, their counts, the context and build llama.cpp reported; log and token events
    change nothing."""
    rec = RunRecorder(n_prompt=N_PROMPT, n_gen=N_GEN, model_path="m.gguf", config=PlanConfig(n_ctx=512), limit=1e9)
    rec.start()
    reps = (_rep(0, 0.4, 0.2), _rep(1, 0.2, 0.1), _rep(2, 0.25, 0.4))
    for ev in (
        # pid, protocol, build, devices, their descriptions, GPU offload
        P.StartedEvent(1, 1, "b1", ("CPU",), ("CPU",), False),
        P.LogEvent(level="info", text="llama_context: n_ctx = 512"),
        P.ContextEvent(
            n_ctx=512, n_ctx_seq=512, n_seq_max=1, n_batch=512, n_ubatch=256, flash_attn=True, kv_unified=False
        ),
        # load_s, of it the model and the context, layers, vocabulary, trained context, threads
        P.LoadedEvent(0.5, 0.4, 0.1, 18, 262144, 32768, 1),
        P.TokenEvent(rep=0, index=0, token=1, dt_s=0.02, t_s=0.02),
        P.BenchResultEvent(reps=reps, peak_rss_bytes=1 << 28, n_threads=1),
    ):
        record_event(rec, ev)
    m = rec.finish()
    assert m.prefill_tok_s == pytest.approx(statistics.median([N_PROMPT / 0.4, N_PROMPT / 0.2, N_PROMPT / 0.25]))
    assert m.decode_tok_s == pytest.approx(N_GEN / 0.2)  # the median of 40, 80 and 20 tok/s
    assert (m.n_prefill_samples, m.n_decode_samples, m.n_threads) == (3, 3, 1)
    assert (m.n_ctx, m.n_ubatch, m.llama_build, m.load_s, m.gpu_offload) == (512, 256, "b1", 0.5, False)
    assert (m.n_depth, m.n_prompt, m.n_gen) == (0, N_PROMPT, N_GEN)
    assert m.model_path == "m.gguf" and m.config == PlanConfig(n_ctx=512)
    assert m.completed and not m.busy and m.keep == Keep()
    # a bench without repetitions (stopped before its result) is no measurement at all
    stopped = RunRecorder(n_prompt=N_PROMPT, n_gen=N_GEN, limit=1e9).start().finish(completed=True)
    assert (
        stopped.prefill_tok_s is None
        and not stopped.completed
        and stopped.keep == Keep(False, False, "this run did not complete")
    )


def test_the_rule_for_what_a_run_may_calibrate():
    """:func:`keep_of` in its order: an unfinished run keeps nothing, a busy one nothing (unless
    the user keeps it), one without a rate only its library figures."""
    quiet = Contention(0.1, 5.0, QUIET_MAX_OTHER_CORES)
    busy = Contention(1.8, 5.0, QUIET_MAX_OTHER_CORES)
    assert keep_of(quiet, completed=True, measured=True) == Keep(True, True, "")
    assert keep_of(quiet, completed=False, measured=True, what="this bench") == Keep(
        False, False, "this bench did not complete"
    )
    k = keep_of(busy, completed=True, measured=True, what="this bench")
    assert (k.calibrate, k.library) == (False, False) and "busy during this bench (1.8 cores" in k.reason
    assert keep_of(busy, completed=True, measured=True, record_anyway=True) == Keep()
    k = keep_of(quiet, completed=True, measured=False)
    assert (k.calibrate, k.library) == (False, True) and "nothing to calibrate" in k.reason
    # under a second, or unmeasured: not busy
    assert keep_of(Contention(5.0, 0.5), completed=True, measured=True) == Keep()
    assert keep_of(Contention(None, 0.0), completed=True, measured=True) == Keep()


def test_the_session_refuses_a_measurement_that_may_not_calibrate(default_profile, tmp_path):
    from kvtuner.core.hardware.host import detect_host
    from kvtuner.core.session import Session

    s = Session(
        model=default_profile,
        config=PlanConfig(n_ctx=4096),
        gpus=(),
        host=detect_host(),
        calibration=CalibrationStore(tmp_path / "calibration.json"),
        measure_host_bandwidth=False,
    )
    plan = s.plan()
    busy = Measurement(0, 512, 128, 2, 300.0, 40.0, other_cores=1.8, busy=True, keep=Keep(False, False, "busy machine"))
    with pytest.raises(BusyMeasurementError, match="busy machine"):
        s.record_run(plan, busy)
    with pytest.raises(CalibrationError, match="nothing to calibrate"):
        s.record_run(plan, Measurement(0, 0, 0, 2, None, None, keep=Keep(False, True, "nothing to calibrate")))
    assert s.calibration_store().runs(s.machine_id) == []
    assert "1 run" in s.record_run(plan, Measurement(0, 512, 128, 2, 300.0, 40.0))


# -- the CLI and the window, one real event stream --------------------------------------------------


@dataclasses.dataclass
class CliBench:
    """One in-process ``kvtuner bench --json``: the events ``run_bench`` handed the CLI, the
    :class:`BenchResult` it returned, the Measurement the CLI's recorder made, its output and
    its data directory."""

    data_dir: Path
    events: list[Any]
    result: Any
    measurement: Measurement
    doc: dict
    stderr: str


def _cli_bench(argv: list[str], env: dict[str, str], replay: CliBench | None = None, wait_s: float = 0.0) -> CliBench:
    """Run ``kvtuner bench`` in this process under ``env``, keeping what it measured. With
    ``replay`` it is handed that bench's events (after ``wait_s`` seconds) instead of running
    llama.cpp again."""
    import kvtuner.runner.bench as bench_module
    from kvtuner.cli import main

    events: list[Any] = []
    made: list[Measurement] = []
    results: list[Any] = []
    real_run_bench, real_finish = bench_module.run_bench, RunRecorder.finish

    def run_bench(*args: Any, on_event: Any, **kw: Any) -> Any:
        def both(ev: Any) -> None:
            events.append(ev)
            on_event(ev)

        if replay is None:
            results.append(real_run_bench(*args, on_event=both, **kw))
        else:
            time.sleep(wait_s)
            for ev in replay.events:
                both(ev)
            results.append(replay.result)
        return results[-1]

    def finish(self: RunRecorder, **kw: Any) -> Measurement:
        made.append(real_finish(self, **kw))
        return made[-1]

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        if QUIET_LIMIT_ENV not in env:
            mp.delenv(QUIET_LIMIT_ENV, raising=False)
        mp.setattr(bench_module, "run_bench", run_bench)
        mp.setattr(RunRecorder, "finish", finish)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    assert rc == 0, err.getvalue()
    assert len(made) == 1 and len(results) == 1
    return CliBench(
        Path(env["KVTUNER_DATA_DIR"]), events, results[0], made[0], json.loads(out.getvalue()), err.getvalue()
    )


@pytest.fixture(scope="module")
def cli_bench(default_model, tmp_path_factory) -> CliBench:
    """A real ``kvtuner bench`` of the default model on a quiet-counted machine (its own data dir)."""
    base = tmp_path_factory.mktemp("cli-bench")
    env = {
        "KVTUNER_DATA_DIR": str(base / "data"),
        "KVTUNER_CONFIG_DIR": str(base / "config"),
        "KVTUNER_CPU_PROBE": "off",
        QUIET_LIMIT_ENV: "inf",
    }
    return _cli_bench([*BENCH, str(default_model)], env)


def _window_handles(qtbot, tmp_path: Path, bench: CliBench, wait_s: float = 0.0):
    """A real window (offscreen) with the bench's model open is handed ``bench``'s events as the
    run controller hands them, then the run's end; returns the window."""
    from kvtuner.core.hardware.host import detect_host
    from kvtuner.gui.run_controller import BenchSettings, RunFinished
    from kvtuner.testing.gui_support import open_window

    config = bench.measurement.config
    w = open_window(
        qtbot,
        config,
        settings=tmp_path,
        hardware=([], detect_host(), "test: no NVML"),
        bench=BenchSettings(n_prompt=N_PROMPT, n_gen=N_GEN, repetitions=REPS),
        model=Path(bench.measurement.model_path),
        wait=lambda w: w.model is not None and w.assessment is not None,
    )
    w.runner.settings = BenchSettings(n_prompt=N_PROMPT, n_gen=N_GEN, repetitions=REPS)  # the Run controls' bench
    w.run_events.begin(w.model_path, config)
    qtbot.wait(int(wait_s * 1000))
    t = time.monotonic()
    for ev in bench.events:
        w.run_events.handle(t, ev)
    w.run_events.handle(t, RunFinished(ok=True, stopped=False, result=bench.result))
    return w


def _recorded(path: Path) -> list[tuple]:
    """(prefill tok/s, decode tok/s, threads, configuration) of every run a calibration file holds."""
    if not path.exists():
        return []
    machines = json.loads(path.read_text())["machines"].values()
    return [
        (r["prefill_tok_s"], r["decode_tok_s"], r["n_threads"], r["config"])
        for m in machines
        for r in m.get("runs", [])
    ]


def _same(m: Measurement) -> Measurement:
    """``m`` without what two measurements of one stream may differ in: the other load each met
    over its own seconds, and the words of the reason that quote it."""
    return dataclasses.replace(m, other_cores=None, keep=dataclasses.replace(m.keep, reason=""))


@pytest.mark.llama
@pytest.mark.slow
@needs_llama
def test_the_cli_bench_and_the_window_make_one_measurement_of_one_run(cli_bench, qtbot, tmp_path):
    cli = cli_bench.measurement
    reps = cli_bench.result.reps
    assert len(reps) == REPS and cli.completed and cli.keep == Keep()
    assert (
        cli.prefill_tok_s
        == statistics.median(r.prefill_tok_s for r in reps)
        == cli_bench.doc["prefill_tok_s"]["median"]
    )
    assert (
        cli.decode_tok_s == statistics.median(r.decode_tok_s for r in reps) == cli_bench.doc["decode_tok_s"]["median"]
    )
    assert (cli.n_prefill_samples, cli.n_decode_samples) == (REPS, REPS)
    assert (cli.n_ctx, cli.n_threads, cli.engine) == (cli_bench.doc["n_ctx"], 1, "embedded")
    assert cli.llama_build == cli_bench.doc["llama_build"] and cli.load_s == cli_bench.doc["load_s"]
    assert cli_bench.doc["contention"]["recorded"] is True and "recorded for speed calibration" in cli_bench.stderr

    w = _window_handles(qtbot, tmp_path, cli_bench)
    try:
        win = w.run_events.measurement
        assert win is not None and _same(win) == _same(cli)
        assert win == dataclasses.replace(cli, other_cores=win.other_cores)  # quiet both: one reason ("")
        qtbot.waitUntil(lambda: "recorded for speed calibration" in w.calibration_note, timeout=30_000)
        # both recorded the same figures for calibration, each in its own store
        figures = _recorded(cli_bench.data_dir / "calibration.json")
        assert figures == _recorded(w.session.calibration_store().path)
        assert [f[:3] for f in figures] == [(cli.prefill_tok_s, cli.decode_tok_s, 1)]
    finally:
        w.shutdown()


@pytest.mark.llama
@pytest.mark.slow
@needs_llama
def test_a_busy_machine_keeps_the_run_out_of_calibration_in_the_cli_and_the_window(
    cli_bench, qtbot, tmp_path, monkeypatch
):
    """Busy loops on every core while the same stream is handed to ``kvtuner bench`` and to the
    window (over 1.5 s each, the rule's limit as shipped): neither calibrates nor saves it."""
    monkeypatch.delenv(QUIET_LIMIT_ENV, raising=False)
    data = tmp_path / "data"
    env = {"KVTUNER_DATA_DIR": str(data), "KVTUNER_CONFIG_DIR": str(tmp_path / "config"), "KVTUNER_CPU_PROBE": "off"}
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        cli = _cli_bench([*BENCH, cli_bench.doc["model_path"]], env, replay=cli_bench, wait_s=1.5)
        w = _window_handles(qtbot, tmp_path, cli_bench, wait_s=1.5)
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()
    try:
        m, win = cli.measurement, w.run_events.measurement
        assert m.busy and m.other_cores > QUIET_MAX_OTHER_CORES and m.quiet_limit_cores == QUIET_MAX_OTHER_CORES
        assert win is not None and win.busy and win.other_cores > QUIET_MAX_OTHER_CORES
        assert (m.keep.calibrate, m.keep.library) == (win.keep.calibrate, win.keep.library) == (False, False)
        assert _same(win) == _same(m)
        assert "the machine was busy during this bench" in cli.stderr and cli.doc["contention"]["recorded"] is False
        assert "machine was busy" in w.calibration_note and "not used for calibration" in w.calibration_note
        qtbot.wait(300)
        assert w.run_events.saved_run_id is None
        assert _recorded(data / "calibration.json") == [] == _recorded(w.session.calibration_store().path)
    finally:
        w.shutdown()
