"""``kvtuner export``: stdout or file, --force, notes on stderr, one-line errors with exit 2."""

from __future__ import annotations

import json

import pytest

from kvtuner.cli import main


def test_stdout_and_notes(default_model, capsys):
    assert (
        main(["export", "--format", "llama-server", "--ctx", "8192", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]) == 0
    )
    out, err = capsys.readouterr()
    assert out == (
        f"llama-server -m {default_model} -c 8192 -ngl all --fit off -fa on -ctk q8_0 -ctv q8_0 -np 1 -b 2048 -ub 512\n"
    )
    assert all(line.startswith("kvtuner: note: ") for line in err.splitlines())


@pytest.mark.parametrize("fmt", ["llama-cpp-python-json", "koboldcpp", "profile"])
def test_json_formats_parse(default_model, capsys, fmt):
    assert main(["export", str(default_model), "--format", fmt]) == 0
    json.loads(capsys.readouterr().out)


def test_output_file_force_and_no_clobber(tmp_path, capsys):
    out = tmp_path / "Modelfile"
    assert main(["export", "--format", "ollama", "-o", str(out)]) == 0
    first = out.read_text()
    assert first.startswith("# kvtuner export for Ollama.") and "wrote" in capsys.readouterr().err
    assert main(["export", "--format", "ollama", "--ctx", "2048", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvtuner: {out} already exists: pass --force to overwrite it, or choose another name\n"
    assert out.read_text() == first
    assert main(["export", "--format", "ollama", "--ctx", "2048", "-o", str(out), "--force"]) == 0
    assert "PARAMETER num_ctx 2048" in out.read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ctx", "-1"], "--ctx must be a positive number"),
        (["-ctv", "q4_0", "-fa", "off"], "requires flash attention"),
        (["--ngl", "5", "--kv-gpu-layers", "9"], "lower --kv-gpu-layers to 4 or less"),
        (["/no/such/model.gguf"], "model file not found"),
        (["--format", "koboldcpp", "--ctx", "400000"], "up to 262144"),
    ],
)
def test_user_mistakes(capsys, argv, message):
    fmt = [] if "--format" in argv else ["--format", "llama-server"]
    assert main(["export", *argv, *fmt]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtuner: ") and message in err and err.count("\n") == 1


def test_not_a_model_for_profile(tmp_path, capsys):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF")
    assert main(["export", str(bad), "--format", "profile"]) == 2
    assert "x.gguf" in capsys.readouterr().err


def test_llama_cpp_spelling_of_ngl(default_model, capsys):
    """The documentation promises llama.cpp's -ngl; only --ngl used to be accepted."""
    assert main(["export", "--format", "llama-server", "-ngl", "0"]) == 0
    assert " -ngl 0 --fit off " in capsys.readouterr().out


def test_empty_output_name_is_an_error_not_stdout(capsys):
    assert main(["export", "--format", "ollama", "-o", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "kvtuner: empty file name: give the file to write\n"


@pytest.mark.parametrize("gpu, buft", [("RX 7900 XTX", "ROCm0"), ("RTX 4090", "CUDA0"), ("Arc B580", "SYCL0")])
def test_partial_kv_split_names_the_gpu_as_its_backend_does(default_model, capsys, gpu, buft):
    """The partial KV split's -ot names the planned card's buffer as its llama.cpp build does
    (a HIP build's "ROCm0"), unless --gpu-buffer-type says otherwise."""
    argv = ["export", str(default_model), "--format", "llama-server", "--kv-gpu-layers", "4", "--gpu", gpu]
    assert main(argv) == 0
    assert f"={buft}'" in capsys.readouterr().out
    assert main([*argv, "--gpu-buffer-type", "Vulkan0"]) == 0
    assert "=Vulkan0'" in capsys.readouterr().out
