"""Attaching to servers that answer badly: the test's own HTTP servers on 127.0.0.1 (HTML,
truncated JSON, a hang, 401, a server that dies), Ollama's ``/api/ps`` in its documented format,
and the command lines kvtuner parses. None of them may raise or stop the watcher."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from kvtuner.cli import main
from kvtuner.cli.args import config_from_server_argv
from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner import attach as A
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.http_support import METRICS, PROPS, SLOTS, Server, good_routes, ok_json

#: Ollama's documented /api/ps answer (docs/api.md, "List Running Models"), digest shortened to
#: a blob the test writes.
OLLAMA_PS = {
    "models": [
        {
            "name": "mistral:latest",
            "model": "mistral:latest",
            "size": 5137025024,
            "digest": "2ae6f6dd7a3dd734790bbbf58b8909a606e0e7e97e94b7604e0aa7ae4490e6d8",
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "llama",
                "families": ["llama"],
                "parameter_size": "7.2B",
                "quantization_level": "Q4_0",
            },
            "expires_at": "2024-06-04T14:38:31.83753-07:00",
            "size_vram": 5137025024,
            "context_length": 4096,
        }
    ]
}


@pytest.fixture
def server():
    made = []

    def make(routes):
        s = Server(routes)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def test_a_good_answer_is_read(server):
    s = server(good_routes())
    w = A.ServerWatcher(s.url)
    t_before = time.monotonic()
    sample = w.poll()
    t_first = time.monotonic()
    assert sample.state == "ok" and sample.problems == ()
    assert sample.model_path == "/nowhere/model.gguf" and sample.total_slots == 2 and sample.n_ctx_slot == 1024
    assert [(x.id, x.tokens, x.n_decoded, x.processing) for x in sample.slots] == [
        (0, 300, 40, True),
        (1, 20, 12, False),
    ]
    assert sample.tokens_in_context == 320 and sample.context_fill == pytest.approx(300 / 1024)
    assert sample.requests_processing == 1 and sample.requests_deferred == 2
    assert sample.metrics_enabled is True
    # the server advanced: 25 more tokens in slot 0, 50 more finished tokens in 2 s of generation
    s.httpd.routes["/slots"] = ok_json(
        [SLOTS[0] | {"n_prompt_tokens": 325, "next_token": [{"n_decoded": 65}]}, SLOTS[1]]
    )
    s.httpd.routes["/metrics"] = (
        200,
        "text/plain",
        METRICS.replace("predicted_total 200", "predicted_total 250").replace(
            "predicted_seconds_total 10", "predicted_seconds_total 12"
        ),
    )
    second = w.poll()
    t_second = time.monotonic()
    assert t_second - t_before >= A.MIN_INTERVAL_S  # never two polls within a second
    assert second.decode_tokens == 25
    assert second.decode_tok_s == pytest.approx(25 / second.decode_span_s)
    # the span runs from the first poll's /slots answer to the second's: the second poll starts
    # MIN_INTERVAL_S after the first started
    assert A.MIN_INTERVAL_S - (t_first - t_before) <= second.decode_span_s <= t_second - t_before
    assert second.decode_tok_s_finished == pytest.approx(25.0)
    # one request per endpoint per poll; /props is not asked again within 10 s
    paths = [p for p, _ in s.hits]
    assert paths.count("/health") == 2 and paths.count("/slots") == 2 and paths.count("/metrics") == 2
    assert paths.count("/props") == 1


def test_html_truncated_json_and_garbage_are_one_line_each(server):
    s = server(
        {
            "/health": ok_json({"status": "ok"}),
            "/props": (200, "text/html", "<!DOCTYPE html><html><body>proxy error</body></html>"),
            "/slots": (200, "application/json", '[{"id": 0, "n_ctx": 10'),
            "/metrics": (200, "text/plain", "nothing of interest\n"),
        }
    )
    w = A.ServerWatcher(s.url)
    sample = w.poll()
    assert sample.state == "ok"
    assert len(sample.problems) == 3
    assert sample.problems[0].startswith("/props: HTML")
    assert sample.problems[1].startswith("/slots: not JSON")
    assert sample.problems[2] == "/metrics: no llamacpp: series in the answer"
    assert all("\n" not in p for p in sample.problems)
    # a list of something else
    s.httpd.routes["/slots"] = ok_json({"error": "no"})
    assert w.poll().problems[1] == "/slots: /slots answered a dict, not a list of slots"


def test_a_hanging_endpoint_times_out_and_backs_off(server):
    def hang(_h):
        time.sleep(3)
        return ok_json(SLOTS)

    routes = good_routes() | {"/slots": hang}
    s = server(routes)
    w = A.ServerWatcher(s.url, timeout_s=0.5)
    t0 = time.monotonic()
    first = w.poll()
    assert time.monotonic() - t0 < 2.5
    assert "/slots: no answer within 0.5 s" in first.problems
    assert first.requests_processing == 1  # the rest still read
    second = w.poll()  # /slots is skipped during its back-off
    assert not any(p.startswith("/slots") for p in second.problems)
    assert [p for p, _ in s.hits].count("/slots") == 1


def test_401_says_to_give_the_key_and_the_key_works(server):
    def guarded(body):
        def route(h):
            if h.headers.get("Authorization") != "Bearer sekrit":
                return (401, "application/json", json.dumps({"error": {"code": 401, "message": "Invalid API Key"}}))
            return body

        return route

    r = good_routes()
    s = server({"/health": r["/health"], **{k: guarded(v) for k, v in r.items() if k != "/health"}})
    sample = A.ServerWatcher(s.url).poll()
    assert sample.state == "ok"
    assert "/slots: HTTP 401: the server wants an API key (give --api-key)" in sample.problems
    good = A.ServerWatcher(s.url, api_key="sekrit").poll()
    assert good.problems == () and len(good.slots) == 2


@pytest.mark.slow
def test_a_dying_server_is_gone_and_watched_again_when_it_returns(server):
    s = server(good_routes())
    port = s.port
    w = A.ServerWatcher(s.url)
    assert w.poll().state == "ok"
    s.stop()
    gone = w.poll()
    assert gone.state == "gone" and gone.problems == ("/health: connection refused",)
    assert any("is gone" in n for n in gone.notes)
    # back on the same port, now serving another model
    s2 = None
    for _ in range(20):
        try:
            s2 = Server(good_routes() | {"/props": ok_json(PROPS | {"model_path": "/nowhere/other.gguf"})})
            break
        except OSError:
            time.sleep(0.1)
    assert s2 is not None
    try:
        w2 = A.ServerWatcher(f"http://127.0.0.1:{s2.port}")
        w2._props = dict(PROPS)  # what it served before
        back = w2.poll()
        assert back.model_path == "/nowhere/other.gguf"
        assert any("now serves /nowhere/other.gguf" in n for n in back.notes)
    finally:
        s2.stop()
    del port


def test_a_restart_is_noticed_from_the_metrics_start_time(server):
    s = server(good_routes() | {"/metrics": (200, "text/plain", METRICS, {"Process-Start-Time-Unix": "1000"})})
    w = A.ServerWatcher(s.url)
    assert w.poll().notes == ()
    s.httpd.routes["/metrics"] = (200, "text/plain", METRICS, {"Process-Start-Time-Unix": "2000"})
    assert w.poll().notes == ("the server restarted",)


@pytest.mark.slow
def test_cli_keeps_watching_a_server_that_dies(server):
    s = server(good_routes())

    def kill_soon():
        # until the monitor's first poll has asked /slots
        deadline = time.monotonic() + 60
        while "/slots" not in [p for p, _ in s.hits] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)
        s.stop()

    threading.Thread(target=kill_soon, daemon=True).start()
    cp = run_kvtuner("monitor", s.url, "--json", "--duration", "6", checkout=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr
    lines = [json.loads(x) for x in cp.stdout.splitlines()]
    samples = [x for x in lines if x["type"] == "sample"]
    assert samples[0]["state"] == "ok" and samples[-1]["state"] == "gone"
    assert len(samples) >= 3


@pytest.mark.slow
def test_ollama_ps_is_parsed_and_shown(server, tmp_path, monkeypatch, capsys, default_model):
    digest = OLLAMA_PS["models"][0]["digest"]
    blobs = tmp_path / "models" / "blobs"
    blobs.mkdir(parents=True)
    # the blob Ollama would hold: a real GGUF (the default model)
    (blobs / f"sha256-{digest}").symlink_to(default_model)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "models"))
    s = server({"/api/ps": ok_json(OLLAMA_PS), "/api/version": ok_json({"version": "0.5.7"})})
    sample = A.OllamaWatcher(s.url).poll()
    assert sample.state == "ok"
    (m,) = sample.models
    assert (m.name, m.size_bytes, m.vram_bytes, m.context_length) == ("mistral:latest", 5137025024, 5137025024, 4096)
    assert m.ram_bytes == 0 and m.expires_at.startswith("2024-06-04")
    assert m.blob == str(blobs / f"sha256-{digest}")
    assert main(["monitor", s.url, "--duration", "1"]) == 0
    out = capsys.readouterr().out
    assert "attached to ollama" in out
    assert "mistral:latest ctx 4096 size 4899 MiB (VRAM 4899 MiB, RAM 0 MiB)" in out
    # kvtuner's plan for the blob at Ollama's context: the KV of 4096 tokens of this model
    assert "kvtuner plans" in out
    assert main(["monitor", s.url, "--duration", "1", "--json"]) == 0
    (sample,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if '"sample"' in x]
    planned = sample["models"][0]["planned"]
    assert (
        planned["config"]["n_ctx"] == 4096 and planned["kv_bytes"] > 0 and planned["total_bytes"] > planned["kv_bytes"]
    )
    # a broken /api/ps is one line
    s.httpd.routes["/api/ps"] = (200, "application/json", '{"models": [')
    assert A.OllamaWatcher(s.url).poll().problems[0].startswith("/api/ps: not JSON")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["monitor", "999999999"], "no process 999999999"),
        (["monitor", "http://127.0.0.1:1", "--interval", "0.2"], "--interval must be 1 second or more"),
        (["monitor", "ftp://x"], "is not a server address"),
        (["monitor", str(os.getpid())], "is not a llama-server"),
    ],
)
def test_user_mistakes_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_command_line_through_the_catalogue(default_profile):
    argv = [
        "/opt/llama/llama-server",
        "-m",
        "m.gguf",
        "--ctx-size",
        "8192",
        "-np",
        "2",
        "-ctk",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "-fa",
        "on",
        "-ub",
        "256",
        "-ngl",
        "20",
        "--no-mmap",
        "-ot",
        "exps=CPU",
        "--port",
        "8081",
        "-t",
        "3",
        "--jinja",
        "--temp",
        "0.7",
        "--flash-attn",
        "sometimes",
    ]
    cfg, ns, unknown = config_from_server_argv(argv, model=default_profile)
    assert cfg == PlanConfig(
        n_ctx=8192,
        n_seq=2,
        type_k="q8_0",
        type_v="q8_0",
        flash_attn="on",
        n_ubatch=256,
        n_gpu_layers=20,
        use_mmap=False,
        tensor_overrides=("exps=CPU",),
    )
    assert (ns.server_model, ns.server_port, ns.server_threads) == ("m.gguf", "8081", "3")
    assert unknown[0].startswith("--flash-attn sometimes (invalid choice")
    assert unknown[1:] == ["--jinja", "--temp 0.7"]
    # llama-server's own defaults where a flag is absent: the training context, 4 unified slots
    cfg, _, unknown = config_from_server_argv(["llama-server", "-m", "m.gguf"], model=default_profile)
    assert (cfg.n_ctx, cfg.n_seq, cfg.kv_unified) == (default_profile.n_ctx_train, 4, True) and unknown == []
    assert A.url_of_argv(argv) == "http://127.0.0.1:8081"
    assert A.url_of_argv(["llama-server", "--host", "0.0.0.0"]) == "http://127.0.0.1:8080"
