"""kvtuner profile: round trip, warnings for another machine or a changed model, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtuner.cli import main
from kvtuner.core.export import (
    GpuFingerprint,
    MachineFingerprint,
    ModelIdentity,
    ProfileError,
    export,
    load_profile,
    read_profile,
    write_text_atomic,
)
from kvtuner.core.plan.config import PlanConfig
from kvtuner.testing.gguf_factory import ModelSpec, write_model

HERE = MachineFingerprint(
    "Linux 6.8.0", "x86_64", "AMD Ryzen 7 5800X", 32 * 2**30, (GpuFingerprint("NVIDIA GeForce RTX 3060", 12 * 2**30),)
)
ELSEWHERE = MachineFingerprint(
    "Linux 6.1.0", "x86_64", "Intel Core i5-12400", 16 * 2**30, (GpuFingerprint("NVIDIA GeForce RTX 4060", 8 * 2**30),)
)
CONFIG = PlanConfig(
    n_ctx=8192,
    n_gpu_layers=3,
    kv_gpu_layers=2,
    type_k="q8_0",
    type_v="q4_0",
    flash_attn="on",
    n_seq=2,
    n_ubatch=256,
    n_batch=512,
    swa_full=True,
    kv_unified=True,
    use_mmap=False,
)
BUILD = "llama-cpp-python 0.3.36"


@pytest.fixture()
def model(tmp_path) -> Path:
    return write_model(tmp_path / "my model.gguf", ModelSpec(n_layer=4))


def _save_profile(tmp_path, model, machine=HERE, measured=None) -> Path:
    r = export(
        "profile",
        model,
        CONFIG,
        machine=machine,
        llama_cpp_build_text=BUILD,
        measured=measured or {"decode_tok_s": 12.5, "peak_vram_bytes": 3 * 2**30},
    )
    return write_text_atomic(tmp_path / r.filename_suggestion, r.text)


def test_round_trip_same_machine_no_warnings(tmp_path, model):
    path = _save_profile(tmp_path, model)
    model_path, config, warnings = load_profile(path, machine=HERE, llama_cpp_build=BUILD)
    assert (model_path, config, warnings) == (model, CONFIG, ())
    prof = read_profile(path)
    assert prof.measured == {"decode_tok_s": 12.5, "peak_vram_bytes": 3 * 2**30}
    assert prof.model == ModelIdentity.from_path(model)
    assert prof.machine == HERE and prof.llama_cpp_build == BUILD


def test_other_machine_and_build_warn(tmp_path, model):
    path = _save_profile(tmp_path, model, machine=ELSEWHERE)
    _, config, warnings = load_profile(path, machine=HERE, llama_cpp_build="llama-cpp-python 0.4.0")
    assert config == CONFIG
    assert len(warnings) == 2
    assert warnings[0].startswith(
        "profile made on another machine (GPUs NVIDIA GeForce RTX 4060 (8 GiB) there, "
        "NVIDIA GeForce RTX 3060 (12 GiB) here; RAM 16 GiB there, 32 GiB here"
    )
    assert warnings[1] == "profile made with llama-cpp-python 0.3.36, this machine has llama-cpp-python 0.4.0."


def test_changed_model_warns(tmp_path, model):
    path = _save_profile(tmp_path, model)
    write_model(model, ModelSpec(n_layer=5))  # re-written in place: other header, other size
    _, _, warnings = load_profile(path, machine=HERE, llama_cpp_build=BUILD)
    assert len(warnings) == 1 and "is not the one profiled" in warnings[0] and "header hash differs" in warnings[0]


def test_moved_or_missing_model(tmp_path, model):
    path = _save_profile(tmp_path, model)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.move(str(path), moved / path.name)
    shutil.move(str(model), moved / model.name)
    model_path, _, warnings = load_profile(moved / path.name, machine=HERE, llama_cpp_build=BUILD)
    assert model_path == moved / model.name
    assert warnings == (f"model not found at {model}; using {moved / model.name} next to the profile.",)
    (moved / model.name).unlink()
    model_path, _, warnings = load_profile(moved / path.name, machine=HERE, llama_cpp_build=BUILD)
    assert model_path == model and "not found: pass the model's path" in warnings[0]


def _valid(tmp_path, model) -> dict:
    return json.loads(_save_profile(tmp_path, model).read_text())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("config"), "'config' is missing"),
        (lambda d: d["config"].update(n_ctx="8192"), "config.n_ctx has the wrong type"),
        (lambda d: d["config"].update(n_ctx=True), "config.n_ctx must be a number"),
        (lambda d: d["config"].update(n_ctx=-5), "--ctx must be a positive number"),
        (lambda d: d["config"].update(type_k="q3_k"), "unknown KV cache type 'q3_k'"),
        (lambda d: d["config"].update(flash_attn="off"), "requires flash attention"),
        (lambda d: d["config"].update(bogus=1), "unknown configuration keys: bogus"),
        (lambda d: d["model"].pop("header_sha256"), "model.header_sha256 is missing"),
        (lambda d: d["model"].update(path=None), "model.path is missing"),
        (lambda d: d["model"].update(file_bytes="big"), "file_bytes must be a whole number"),
        (lambda d: d.update(machine=[1]), "'machine' must be an object"),
        (lambda d: d["machine"].update(gpus=[{"name": "x"}]), "machine.gpus[0].total_bytes is missing"),
        (lambda d: d.update(measured={"decode_tok_s": "fast"}), "measured decode_tok_s must be a number"),
        (lambda d: d.update(measured=[1, 2]), "must be a mapping"),
        (lambda d: d.update(kvtuner_profile=2), "written by a newer kvtuner"),
        (lambda d: d.update(kvtuner_profile="1"), "must be a format number"),
        (lambda d: d.pop("kvtuner_profile"), "not a kvtuner profile"),
        (lambda d: d.update(note=5), "note must be text"),
    ],
)
def test_malformed_fields_are_one_line_errors(tmp_path, model, mutate, message):
    d = _valid(tmp_path, model)
    mutate(d)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ProfileError) as ei:
        load_profile(bad, machine=HERE)
    text = str(ei.value)
    assert message in text and str(bad) in text and "\n" not in text


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "invalid JSON"),
        (b"{", "invalid JSON"),
        (b"[1, 2]", "not a kvtuner profile"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "invalid JSON"),  # nesting past the recursion limit
        (b"GGUF\x03\x00\x00\x00", "invalid JSON"),
    ],
)
def test_garbage_files(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(ProfileError, match=message):
        read_profile(bad)


def test_missing_large_and_folder(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        read_profile(tmp_path / "nope.json")
    with pytest.raises(ProfileError, match="is a folder"):
        read_profile(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20))
    with pytest.raises(ProfileError, match="too large"):
        read_profile(big)


def test_cli_round_trip_through_profile(tmp_path, model, capsys):
    out = tmp_path / "p.kvtuner.json"
    flags = ["--ctx", "8192", "--ngl", "3", "--kv-gpu-layers", "0", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
    assert main(["export", str(model), *flags, "--format", "profile", "-o", str(out)]) == 0
    assert main(["export", str(model), *flags, "--format", "llama-server"]) == 0
    direct = capsys.readouterr().out
    assert main(["export", "--profile", str(out), "--format", "llama-server"]) == 0
    via_profile = capsys.readouterr()
    assert via_profile.out == direct
    # flags given with --profile override the profile's values
    assert main(["export", "--profile", str(out), "--ctx", "4096", "--format", "llama-server"]) == 0
    assert " -c 4096 " in capsys.readouterr().out


def test_cli_malformed_profile_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert main(["export", "--profile", str(bad), "--format", "ollama"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtuner: ") and "not a kvtuner profile" in err and err.count("\n") == 1
