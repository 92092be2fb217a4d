"""Hostile file names reach the target unchanged; saves are atomic and never clobber.

Each command-line or file target is checked by the program that reads it: the llama-server
line by a real POSIX shell (with a stand-in binary that prints its argv), the Python snippet
by Python (with a stand-in ``llama_cpp`` module), the JSON targets by json, the Modelfile by
a port of Ollama's FROM value rule (parser/parser.go ``unquote``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvtuner.core.export import ExportError, export, write_text_atomic
from kvtuner.core.plan.config import PlanConfig

HOSTILE_NAMES = [
    "my model.gguf",
    "it's.gguf",
    'say "hi".gguf',
    "$HOME.gguf",
    "$(touch pwned).gguf",
    "`touch pwned`.gguf",
    "back\\slash.gguf",
    "semi;colon&amp|pipe.gguf",
    "-ngl 0.gguf",
    "ünïcødé 模型.gguf",
    "tab\there.gguf",
    "new\nline.gguf",
    "*glob?[x].gguf",
    "'; rm -rf ~; '.gguf",
]
CONFIG = PlanConfig(n_ctx=2048, type_k="q8_0", type_v="q8_0", flash_attn="on")


@pytest.fixture()
def fake_server(tmp_path) -> Path:
    """A stand-in 'llama-server' (in a folder with a space) that prints its argv as JSON."""
    d = tmp_path / "bin dir"
    d.mkdir()
    exe = d / "llama-server"
    exe.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n", encoding="utf-8")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_llama_server_line_survives_a_real_shell(tmp_path, fake_server, name):
    model = tmp_path / "models" / name
    model.parent.mkdir()
    model.write_bytes(b"")
    r = export("llama-server", model, CONFIG, binary=str(fake_server))
    sh = shutil.which("sh") or "/bin/sh"
    out = subprocess.run([sh, "-c", r.text], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert argv[0:2] == ["-m", str(model)]
    assert list(r.argv[1:]) == argv
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_python_snippet_and_json_carry_the_exact_path(tmp_path, name):
    model = tmp_path / name
    snippet = export("llama-cpp-python", model, CONFIG).text
    stub = tmp_path / "stub"
    (stub / "llama_cpp").mkdir(parents=True)
    (stub / "llama_cpp" / "__init__.py").write_text(
        textwrap.dedent("""
        import json
        class Llama:
            def __init__(self, **kw):
                print(json.dumps(kw))
            def create_completion(self, prompt, max_tokens):
                return {"choices": [{"text": ""}]}
    """),
        encoding="utf-8",
    )
    script = tmp_path / "snippet.py"
    script.write_text(snippet, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(stub)},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    kwargs = json.loads(out.stdout.splitlines()[0])
    assert kwargs["model_path"] == str(model)
    assert json.loads(export("llama-cpp-python-json", model, CONFIG).text)["model_path"] == str(model)
    assert json.loads(export("koboldcpp", model, CONFIG).text)["model_param"] == str(model)


def _ollama_from_value(modelfile: str) -> str:
    """Ollama's rule for a FROM value: the rest of the line, trimmed, with one level of
    ``\"\"\"`` or ``"`` quotes removed (parser/parser.go ``unquote``)."""
    line = next(line for line in modelfile.splitlines() if line.startswith("FROM "))
    s = line[len("FROM ") :].strip()
    if s.startswith('"""'):
        assert s.endswith('"""') and len(s) >= 6
        return s[3:-3]
    if s.startswith('"'):
        assert s.endswith('"') and len(s) >= 2
        return s[1:-1]
    return s


@pytest.mark.parametrize(
    "name", [n for n in HOSTILE_NAMES if "\n" not in n and "\t" not in n] + ['"quoted".gguf', 'end"']
)
def test_ollama_from_line(tmp_path, name):
    model = tmp_path / name
    assert _ollama_from_value(export("ollama", model, CONFIG).text) == str(model)


@pytest.mark.parametrize("name", ["new\nline.gguf", "tab\there.gguf", 'a"""b.gguf'])
def test_ollama_refuses_what_a_modelfile_cannot_hold(tmp_path, name):
    with pytest.raises(ExportError, match="rename the file"):
        export("ollama", tmp_path / name, CONFIG)


def test_non_utf8_name_is_a_clear_error(tmp_path):
    name = os.fsdecode(b"caf\xe9.gguf")  # Latin-1 bytes: a surrogate escape in Python
    for target in ("llama-server", "llama-cpp-python", "ollama", "koboldcpp"):
        with pytest.raises(ExportError, match="not valid UTF-8"):
            export(target, tmp_path / name, CONFIG)


# ---------------------------------------------------------------------------------- atomic writes
def test_write_never_overwrites_without_force(tmp_path):
    f = tmp_path / "out.sh"
    write_text_atomic(f, "one\n")
    with pytest.raises(ExportError, match="already exists: pass --force"):
        write_text_atomic(f, "two\n")
    assert f.read_text() == "one\n"
    write_text_atomic(f, "two\n", force=True)
    assert f.read_text() == "two\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.sh"]  # no temp files left


def test_write_keeps_mode_and_handles_bad_targets(tmp_path):
    f = tmp_path / "run.sh"
    f.write_text("old\n")
    f.chmod(0o750)
    write_text_atomic(f, "new\n", force=True)
    assert f.stat().st_mode & 0o777 == 0o750
    with pytest.raises(ExportError, match="is a folder"):
        write_text_atomic(tmp_path, "x")
    with pytest.raises(ExportError, match="cannot write into"):
        write_text_atomic(tmp_path / "missing dir" / "f.txt", "x")
    u = tmp_path / "ünï cødé 'x'.json"
    write_text_atomic(u, "模型\n")
    assert u.read_text(encoding="utf-8") == "模型\n"


def test_kill_during_save_leaves_old_file_intact(tmp_path):
    """A real child process is SIGKILLed after writing the temp file, before the rename."""
    target = tmp_path / "profile.kvtuner.json"
    target.write_text("OLD CONTENT\n", encoding="utf-8")
    ready = tmp_path / "ready"
    child = textwrap.dedent(f"""
        import pathlib, time
        from kvtuner.core.export import _common
        def pause(tmp):
            pathlib.Path({str(ready)!r}).write_text(str(tmp))
            time.sleep(60)
        _common._before_replace_hook = pause
        _common.write_text_atomic({str(target)!r}, "NEW CONTENT " * 100000, force=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, "child ended before reaching the pause"
            assert time.monotonic() < deadline, "child never reached the pause"
            time.sleep(0.05)
        tmp_file = Path(ready.read_text())
        assert tmp_file.parent == tmp_path and tmp_file.stat().st_size == len("NEW CONTENT ") * 100000
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_text(encoding="utf-8") == "OLD CONTENT\n"
    # the next save still works and replaces it whole
    write_text_atomic(target, "NEWER\n", force=True)
    assert target.read_text(encoding="utf-8") == "NEWER\n"


# ---------------------------------------------------------------------------------- QA pass fixes
def test_force_never_replaces_a_special_file(tmp_path):
    """`-o /dev/null --force` (as root) used to swap the device for a regular file: os.replace
    renames over anything. A FIFO stands in for the device here."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for force in (False, True):
        with pytest.raises(ExportError, match="not a regular file"):
            write_text_atomic(fifo, "x\n", force=force)
    assert fifo.exists() and not fifo.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_trailing_slash_names_a_folder_even_if_missing(tmp_path):
    """`-o newdir/` used to write a file called newdir (Path() drops the slash)."""
    with pytest.raises(ExportError, match="is a folder"):
        write_text_atomic(str(tmp_path / "newdir") + "/", "x\n")
    assert not (tmp_path / "newdir").exists()
    with pytest.raises(ExportError, match="empty file name"):
        write_text_atomic("", "x\n")


def test_force_writes_through_a_symlink(tmp_path):
    """A link to a file keeps being a link (as `>` in a shell); the file it points to changes."""
    real = tmp_path / "real.sh"
    real.write_text("old\n")
    link = tmp_path / "link.sh"
    link.symlink_to(real)
    with pytest.raises(ExportError, match="already exists"):
        write_text_atomic(link, "new\n")
    write_text_atomic(link, "new\n", force=True)
    assert link.is_symlink() and real.read_text() == "new\n"


@pytest.mark.parametrize("name", ["no\u00a0break.gguf", "zero\u200dwidth.gguf", "line\u2028sep.gguf", "c1\x85.gguf"])
def test_ollama_refuses_characters_its_parser_drops(tmp_path, name):
    """Ollama's ParseFile keeps only strconv.IsPrint runes: a no-break space or zero-width joiner
    would vanish and FROM would name another file."""
    with pytest.raises(ExportError, match="rename the file"):
        export("ollama", tmp_path / name, CONFIG)
