"""The window attached to a running server (Run > Attach): a real llama-server with a client
sending requests, graphed live beside kvtuner's plan for the configuration on its command line
(real widgets, offscreen; VRAM through the NVML stand-in); and a server of the test's own that
answers badly and dies, which must neither raise nor stop the window."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from kvtuner.core.hardware import nvml
from kvtuner.core.hardware.host import detect_host
from kvtuner.core.monitor.sampler import Sampler
from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner.engines import llama_cpp_bin_server
from kvtuner.testing.gui_support import NO_MODEL
from kvtuner.testing.http_support import Server, good_routes, ok_json
from kvtuner.testing.nvml_standin import fake_nvml
from kvtuner.testing.server_support import CompletionClient as Client
from kvtuner.testing.server_support import start_llama_server, stop_group

BIN = llama_cpp_bin_server()
SHOTS = Path(os.environ.get("KVTUNER_SCREENSHOTS", "/tmp/kvtuner-shots"))
#: the attached server's command line, and the configuration the window must open for it
FLAGS = ["-c", "2048", "-np", "2", "-t", "1", "-ctk", "q8_0", "-fa", "on", "-ub", "256"]
CONFIG = PlanConfig(n_ctx=2048, n_seq=2, type_k="q8_0", flash_attn="on", n_ubatch=256)


@pytest.fixture
def window(make_window):
    """A shown window with the real sampler, planning for ``gpus`` on this machine's host; no model opened."""

    def make(gpus):
        sampler = Sampler(interval_s=0.5, capacity=600, gpus=bool(gpus))
        return make_window(hardware=(gpus, detect_host(), "test"), sampler=sampler, size=(1400, 900), model=NO_MODEL)

    return make


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's llama-server")
def test_window_graphs_an_attached_llama_server(qtbot, tmp_path, default_model, window):
    proc, port, _ = start_llama_server(BIN, default_model, tmp_path, FLAGS)
    nvml.use_nvml_module(fake_nvml(1, runner_pid=proc.pid))
    client = Client(port, n_predict=64)
    w = None
    try:
        w = window(nvml.detect_gpus())
        client.start()
        assert w.attach_to(str(proc.pid))
        # the server's model opens with the configuration of its command line
        qtbot.waitUntil(
            lambda: w.model_path == default_model and w.config == CONFIG and w.plan is not None, timeout=60_000
        )
        qtbot.waitUntil(lambda: w.graphs.point_count("decode") >= 3, timeout=60_000)
        qtbot.waitUntil(lambda: w.run_controls.progress.format().startswith("attached: context"), timeout=30_000)
        a = w.attached
        assert a is not None and a.monitor is not None and a.monitor.server.pid == proc.pid
        # the samplers follow the server's process: its RSS and its VRAM (the stand-in's 900 MiB)
        qtbot.waitUntil(
            lambda: w.graphs.series["runner_rss"].last() is not None and w.graphs.series["runner_rss"].last() > 0.05,
            timeout=30_000,
        )
        qtbot.waitUntil(
            lambda: (
                w.graphs.series.get("vram_runner0") is not None
                and w.graphs.series["vram_runner0"].last() == pytest.approx(900 / 1024)
            ),
            timeout=30_000,
        )
        # the context fill: the KV bytes holding tokens, at most the plan's whole KV cache
        qtbot.waitUntil(lambda: "context" in w.graphs.series and w.graphs.point_count("context") >= 2, timeout=30_000)
        kv_gib = w.graphs.series["context"].arrays()[1]
        assert (kv_gib > 0).all() and (kv_gib <= w.plan.kv_bytes / (1 << 30)).all()
        # kvtuner's prediction beside the measurements: the dashed lines of the plan for this configuration
        assert w.graphs._predicted
        decode = w.graphs.series["decode"].arrays()[1]
        assert (decode > 1).all()
        assert w.run_events.live_state is not None and w.run_events.live_state.decode_tok_s is not None
        assert "attached: llama-server" in w.status.fields["runner"].text()
        w.graphs.refresh()
        SHOTS.mkdir(parents=True, exist_ok=True)
        assert w.grab().save(str(SHOTS / "attach-llama-server.png"))
        # the window does not wait for the poll under way: one is held open while it detaches
        entered, gate, step = threading.Event(), threading.Event(), a.monitor.step
        a.monitor.step = lambda: (entered.set(), gate.wait(30), step())[2]
        assert entered.wait(10)
        w.detach()
        assert a.running
        gate.set()
        assert w.attached is None
        qtbot.waitUntil(lambda: not a.running, timeout=10_000)
        assert w.run_controls.progress.format().startswith("detached from llama-server")
        assert w.run_action.isEnabled()
    finally:
        client.stop.set()
        if w is not None:
            w.shutdown()
        nvml.use_nvml_module(None)
        stop_group(proc)
        client.join(60)


@pytest.mark.slow
def test_window_survives_bad_answers_and_a_dying_server(qtbot, tmp_path, window):
    s = Server(good_routes() | {"/slots": (200, "application/json", '[{"id": 0, "n_ct')})
    try:
        w = window([])
        assert w.attach_to(s.url)
        qtbot.waitUntil(lambda: "/slots: not JSON" in w.status.currentMessage(), timeout=20_000)
        # a 401 on every endpoint but /health
        s.httpd.routes.update(
            {
                k: (401, "application/json", json.dumps({"error": "Invalid API Key"}))
                for k in ("/props", "/slots", "/metrics")
            }
        )
        qtbot.waitUntil(lambda: "give --api-key" in w.status.currentMessage(), timeout=20_000)
        s.httpd.routes.update(good_routes() | {"/props": ok_json({"model_path": "/nowhere/x.gguf"})})
        s.stop()
        qtbot.waitUntil(lambda: w.run_controls.progress.format() == "attached: server gone", timeout=20_000)
        assert w.attached is not None and w.attached.running  # still watching
        w.detach()
        assert w.attached is None
        # a target that names nothing: one line, and the window is not attached
        assert w.attach_to("999999999")
        qtbot.waitUntil(lambda: w.attached is None, timeout=10_000)
        assert "no process 999999999" in w.status.currentMessage()
        w.shutdown()
    finally:
        try:
            s.stop()
        except Exception:
            pass


@pytest.mark.llama  # the window looks for llama.cpp engines (llama-server --version, --help)
def test_attach_dialog_lists_found_servers_and_takes_a_url(qtbot, tmp_path, window):
    from kvtuner.gui.attach import AttachDialog
    from kvtuner.runner.attach import FoundServer

    s = Server(good_routes())
    try:
        w = window([])
        d = AttachDialog(w)
        qtbot.addWidget(d)
        qtbot.waitUntil(lambda: w.tasks.pending == 0 and not d.note.text().startswith("looking"), timeout=20_000)
        found = [
            FoundServer("llama-server", s.url, 4321, ("llama-server", "-m", "/m/gemma.gguf", "--port", str(s.port))),
            FoundServer("ollama", "http://127.0.0.1:11434", answers=True),
        ]
        d.set_found(found)
        assert [d.list.item(i).text() for i in range(d.list.count())] == [
            f"llama-server {s.url} (pid 4321, gemma.gguf)",
            "ollama http://127.0.0.1:11434",
        ]
        assert d.chosen() is found[0] and d.target.text() == s.url
        d.list.setCurrentRow(1)
        assert d.chosen() is found[1]
        d.target.setText("127.0.0.1:9")
        assert d.chosen() == "127.0.0.1:9"
        w.attach_to(s.url)
        qtbot.waitUntil(lambda: w.run_controls.progress.format().startswith("attached: context"), timeout=20_000)
        assert w.run_controls.progress.format() == "attached: context 300/1024 (29%)"
        w.shutdown()
    finally:
        s.stop()
