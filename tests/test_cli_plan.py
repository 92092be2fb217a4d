"""``kvtuner plan`` / ``inspect`` as a user runs them: real processes, the default model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvtuner.core.units import MiB
from kvtuner.testing.cli import run_kvtuner


def test_done_when_plan_json_default_model():
    """The default model at n_ctx 8192, q8_0 K and V, FA on, swa_full off -> 12.75 MiB (3 global layers)
    and 7.97 MiB (15 sliding-window layers), the figures llama.cpp reports."""
    out = run_kvtuner(
        "plan", "--ctx", "8192", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--flash-attn", "on", "--json"
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    caches = [(c["kind"], c["cells"], c["layers"], round(c["kv_bytes"] / MiB, 2)) for c in d["kv_caches"]]
    assert caches == [("full", 8192, 3, 12.75), ("swa", 1024, 15, 7.97)]
    for key in ("model", "config", "kv_bytes", "weights_bytes", "devices", "advice"):
        assert key in d
    host = d["devices"][-1]
    for key in (
        "device",
        "weights_bytes",
        "kv_bytes",
        "compute_bytes",
        "output_bytes",
        "overhead_bytes",
        "total_bytes",
        "capacity_bytes",
    ):
        assert key in host
    assert host["total_bytes"] == sum(
        host[k]
        for k in ("weights_bytes", "repack_bytes", "kv_bytes", "compute_bytes", "output_bytes", "overhead_bytes")
    )
    assert host["total_bytes"] == host["mapped_bytes"] + host["committed_bytes"]
    assert d["kv_bytes"] == 12.75 * MiB + 4_177_920 * 2


def test_plan_human_table_and_what_if_gpu():
    out = run_kvtuner("plan", "--ctx", "65536", "--gpu-mem", "12G", "--ngl", "all")
    assert out.returncode == 0, out.stderr
    assert "CUDA0" in out.stdout and "12.00 GiB" in out.stdout and "KV cache" in out.stdout


def test_inspect_json():
    out = run_kvtuner("inspect", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["architecture"] == "gemma3" and d["n_layer"] == 18 and d["n_swa"] == 512


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["--gpu-mem", "12G", "--ngl", "5", "--kv-gpu-layers", "9"],
            "--kv-gpu-layers 9 exceeds the 4 repeating layers offloaded",
        ),
        (["--cache-type-v", "q8_0", "--flash-attn", "off"], "requires flash attention"),
        (["--ctx", "-4096"], "--ctx must be a positive number"),
        (["-np", "-2"], "or -1 for llama-server's auto"),
        (["--cache-type-k", "q2_k"], "unknown KV cache type"),
        (["--gpu-mem", "twelve"], "--gpu-mem"),
        (["--ngl", "-3"], "--ngl must be 0 or more"),
        (["--gpu-mem", "0"], "--gpu-mem: '0' is 0 bytes, too small for a memory size: give a unit, e.g. 12G"),
        (["--gpu-mem", "12"], "--gpu-mem: '12' is 12 bytes"),
        (["--ram", "0"], "--ram: '0' is 0 bytes"),
        (["--kv-gpu-layers", "3"], "--kv-gpu-layers 3 needs a GPU and none is planned for"),
        (["--ctx", "99999999999999999999999"], "--ctx must be at most 4294967040 tokens"),
    ],
)
def test_impossible_configuration_one_line_exit_2(args, needle):
    out = run_kvtuner("plan", *args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert needle in last, out.stderr


def test_ngl_99_means_all_like_llama_cpp():
    out = run_kvtuner("plan", "--gpu-mem", "8G", "--ngl", "99", "--json")
    d = json.loads(out.stdout)
    assert d["effective"]["n_gpu_layers"] == 19 and d["effective"]["output_on_gpu"]
    assert any("-ngl 99" in w for w in d["warnings"])


ADVICE_ARGS = ("--ctx", "65536", "--gpu-mem", "8G", "--ngl", "18", "--cache-type-k", "q8_0", "--cache-type-v", "q4_0")


@pytest.mark.slow
def test_plan_prints_each_fix_as_flags_and_json_carries_the_advice_fields():
    from kvtuner.core.advice.advisor import fix_flags

    out = run_kvtuner("plan", *ADVICE_ARGS, "--json")
    assert out.returncode == 0, out.stderr
    advice = json.loads(out.stdout)["advice"]
    assert advice, "expected advice for a 64K context with mixed KV types on an 8 GB what-if GPU"
    for a in advice:
        assert set(a) == {"id", "severity", "message", "reason", "fix", "fix_label", "trade"}
        assert a["severity"] in ("error", "warning", "info") and a["message"] and a["reason"]
        assert isinstance(a["fix"], dict) and bool(a["fix_label"]) == bool(a["fix"])
    assert [a["severity"] for a in advice] == sorted(
        (a["severity"] for a in advice), key=("error", "warning", "info").index
    )
    text = run_kvtuner("plan", *ADVICE_ARGS)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    fixed = 0
    for a in advice:
        head = f"[{a['severity']}] {a['id']}: {a['message']}"
        assert head in lines, head
        if a["fix"]:
            assert lines[lines.index(head) + 1] == f"    fix: {fix_flags(a['fix'])}"
            fixed += 1
    assert fixed >= 3
    # the printed flags are the fix: given to the same command, that advice goes away
    for a in advice:
        flags = fix_flags(a["fix"]) if a["fix"] else ""
        if not flags.startswith("--") or "(" in flags:
            continue
        again = run_kvtuner("plan", *ADVICE_ARGS, *flags.split(), "--json")
        assert again.returncode == 0, again.stderr
        after = json.loads(again.stdout)["advice"]
        assert a["id"] not in [b["id"] for b in after], (a["id"], flags)


def test_inspect_of_a_fifo_fails_at_once(tmp_path):
    import os

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    out = run_kvtuner("inspect", str(fifo), "--json", timeout=30)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"kvtuner: {fifo}: not a regular file (a pipe or device), not a GGUF file"


@pytest.mark.parametrize(
    "where,needle",
    [
        ("/proc/no-such-dir/shot.png", "--screenshot: cannot create the folder /proc/no-such-dir"),
        (".", "is a directory"),
    ],
)
def test_gui_screenshot_to_an_unwritable_place_is_one_line(tmp_path, where, needle):
    out = run_kvtuner(
        "gui",
        "--screenshot",
        where,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["plan", "--ctx", "abc"], "kvtuner plan: error: argument --ctx/-c/--ctx-size: 'abc' is not a whole number"),
        (["plan", "--gpu-mem"], "kvtuner plan: error: argument --gpu-mem: expected one argument"),
        (["inspect", "--nope"], "kvtuner: error: unrecognized arguments: --nope"),
        (["bench", "-fa", "maybe"], "kvtuner bench: error: argument --flash-attn/-fa: invalid choice: 'maybe'"),
        (["frobnicate"], "kvtuner: error: argument COMMAND: invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, needle):
    """The documentation (docs/reference/cli.md): bad input ends in one line; argparse's usage block is not printed."""
    out = run_kvtuner(*args)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(needle) and "--help" in lines[0], out.stderr


def test_gui_without_a_display_is_one_line_not_a_qt_abort():
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = run_kvtuner(env=env, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtuner: no display to open the app on"), out.stderr


def test_a_closed_pipe_is_not_a_traceback():
    """`kvtuner plan --json | head -1`: the reader leaves early; kvtuner exits quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtuner.cli", "plan", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err
