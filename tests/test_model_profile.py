"""ModelProfile from real and synthetic GGUF files, and every kind of bad file."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import gguf
import pytest

from kvtuner.core.model.profile import GGUFError, ModelProfile
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import LLAMA2_7B, ModelSpec, tensor_bytes, write_model


def test_default_model_profile(default_profile):
    """Gemma 3 270M: values as llama.cpp's load_hparams prints them (print_info in its log)."""
    m = default_profile
    assert m.architecture == "gemma3"
    assert m.n_layer == 18 and m.n_embd == 640
    assert set(m.n_head) == {4} and set(m.n_head_kv) == {1}
    assert m.attention_kind == "MQA"
    assert (m.head_dim_k, m.head_dim_v) == (256, 256)
    assert m.n_ctx_train == 32768 and m.n_swa == 512
    # gemma3: every 6th layer is global (src/models/gemma3.cpp load_swa_pattern(ml, 6))
    assert [il for il, s in enumerate(m.swa_layers) if not s] == [5, 11, 17]
    assert m.n_vocab == 262144
    assert m.file_type == "MOSTLY_Q4_K_M"
    assert m.tied_output
    # llama.cpp's load log: "CPU_Mapped model buffer size = 235.16 MiB" covers every tensor
    assert m.weights_bytes == 246_587_904
    assert round(m.weights_bytes / 2**20, 2) == 235.16
    assert m.n_params == 268_098_176


def test_synthetic_profile_matches_writer(tmp_path):
    spec = ModelSpec(n_layer=3, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=512)
    path = write_model(tmp_path / "gqa.gguf", spec)
    m = ModelProfile.from_gguf(path)
    tb = tensor_bytes(spec)
    assert m.n_head_kv == (2, 2, 2) and m.head_dim_k == 32
    assert m.input_bytes == tb["token_embd.weight"]
    assert m.output_bytes == tb["output.weight"] + tb["output_norm.weight"]
    assert m.layer_bytes[1] == sum(v for k, v in tb.items() if k.startswith("blk.1."))
    assert m.weights_bytes == sum(tb.values())
    assert m.attention_kind == "GQA"


def test_per_layer_head_count_array(tmp_path):
    spec = ModelSpec(n_layer=4, n_embd=128, n_head=4, n_head_kv=[4, 2, 0, 1])
    m = ModelProfile.from_gguf(write_model(tmp_path / "arr.gguf", spec))
    assert m.n_head_kv == (4, 2, 0, 1)
    # llama-hparams.cpp has_kv: every layer of a non-hybrid model has a (here zero-width) KV entry
    assert [m.has_kv(il) for il in range(4)] == [True, True, True, True]
    assert [m.n_embd_k_gqa(il) for il in range(4)] == [128, 64, 0, 32]


def test_profile_of_huge_model_reads_no_weights(tmp_path):
    """A 12.6 GiB (sparse) 7B file is profiled from its header in well under a second."""
    path = write_model(tmp_path / "7b.gguf", LLAMA2_7B)
    assert path.stat().st_size > 12 * 2**30
    t0 = time.perf_counter()
    m = ModelProfile.from_gguf(path)
    assert time.perf_counter() - t0 < 2.0
    assert m.n_params == 6_738_415_616  # LLaMA-2-7B


def test_split_model_reads_as_one(tmp_path):
    spec = ModelSpec(n_layer=2, n_embd=64, n_head=2, n_head_kv=2, n_ff=128, n_vocab=256)
    whole = ModelProfile.from_gguf(write_model(tmp_path / "whole.gguf", spec))
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama", split_max_tensors=8)
    # write the same model through gguf's split writer (random weights so data exists)
    import numpy as np

    from kvtuner.testing.gguf_factory import _tensors

    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    w.add_vocab_size(256)
    for name, shape, t in _tensors(spec):
        dtype = np.float32 if t == gguf.GGMLQuantizationType.F32 else np.float16
        w.add_tensor(name, np.zeros(shape[::-1], dtype=dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(parts) >= 2
    split = ModelProfile.from_gguf(parts[0])
    assert len(split.parts) == len(parts)
    assert split.weights_bytes == whole.weights_bytes
    assert split.layer_bytes == whole.layer_bytes
    # a missing part is named
    parts[-1].unlink()
    with pytest.raises(GGUFError, match=r"split part .* is missing"):
        ModelProfile.from_gguf(parts[0])


# ---- bad input: one clear line naming the file and the problem --------------------------------


def _bytes_header(version=3, n_tensors=0, n_kv=0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


@pytest.fixture
def good(tmp_path) -> Path:
    return write_model(
        tmp_path / "good.gguf", ModelSpec(n_layer=2, n_embd=64, n_head=2, n_head_kv=2, n_ff=128, n_vocab=256)
    )


def _bad_cases(tmp_path: Path, good: Path) -> dict[str, tuple[Path, str]]:
    raw = good.read_bytes()
    cases: dict[str, tuple[Path, str]] = {}

    def put(name: str, data: bytes, match: str) -> None:
        p = tmp_path / name
        p.write_bytes(data)
        cases[name] = (p, match)

    cases["missing"] = (tmp_path / "nope.gguf", "no such file")
    cases["directory"] = (tmp_path, "is a directory")
    os.mkfifo(tmp_path / "fifo.gguf")  # opening a FIFO for reading blocks until a writer comes
    cases["fifo.gguf"] = (tmp_path / "fifo.gguf", "not a regular file")
    put("not_gguf.gguf", b"PK\x03\x04" + b"\0" * 100, "not a GGUF file")
    put("tiny.gguf", b"GGUF", "not a GGUF file")
    put("v1.gguf", _bytes_header(version=1) + b"\0" * 16, "unsupported GGUF version 1")
    put("v9.gguf", _bytes_header(version=9) + b"\0" * 16, "unsupported GGUF version 9")
    put("truncated_header.gguf", raw[:200], "truncated")
    put("huge_counts.gguf", _bytes_header(n_tensors=2**60, n_kv=2**40) + b"\0" * 64, "corrupt")
    put("huge_string.gguf", _bytes_header(n_kv=1) + struct.pack("<Q", 2**62) + b"\0" * 64, "corrupt|truncated")
    data_cut = raw[: len(raw) - 1024]  # tensor data past the end of the file
    put("data_past_end.gguf", data_cut, "past the end of the file")
    put("no_arch.gguf", _bytes_header(n_kv=1) + _kv_string("general.name", "x") + b"\0" * 32, "general.architecture")
    # a metadata value of the wrong type: block_count as a string
    wrong = (
        _bytes_header(n_kv=3)
        + _kv_string("general.architecture", "llama")
        + _kv_string("llama.block_count", "thirty-two")
        + _kv_string("llama.embedding_length", "4096")
    )
    put("wrong_type.gguf", wrong + b"\0" * 32, "should be an integer")
    put(
        "projector.gguf",
        _bytes_header(n_kv=2)
        + _kv_string("general.architecture", "clip")
        + _kv_string("general.type", "mmproj")
        + b"\0" * 32,
        "not a language model",
    )
    return cases


BAD = [
    "missing",
    "directory",
    "fifo.gguf",
    "not_gguf.gguf",
    "tiny.gguf",
    "v1.gguf",
    "v9.gguf",
    "truncated_header.gguf",
    "huge_counts.gguf",
    "huge_string.gguf",
    "data_past_end.gguf",
    "no_arch.gguf",
    "wrong_type.gguf",
    "projector.gguf",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_file_gives_one_line_error(tmp_path, good, case):
    path, match = _bad_cases(tmp_path, good)[case]
    t0 = time.perf_counter()
    with pytest.raises(GGUFError) as info:
        ModelProfile.from_gguf(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg or path.name in msg
    import re

    assert re.search(match, msg), msg
    assert time.perf_counter() - t0 < 2.0


def test_embedding_only_model_refused(tmp_path):
    spec = ModelSpec(arch="bert", n_layer=2, n_embd=64, n_head=2, n_head_kv=2)
    with pytest.raises(GGUFError, match="not a language model"):
        ModelProfile.from_gguf(write_model(tmp_path / "bert.gguf", spec))


@pytest.mark.parametrize("case", ["missing", "fifo.gguf", "not_gguf.gguf", "truncated_header.gguf", "wrong_type.gguf"])
def test_cli_bad_file_exit_2_no_traceback(tmp_path, good, case):
    import re

    path, match = _bad_cases(tmp_path, good)[case]
    out = run_kvtuner("plan", str(path), timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtuner: "), out.stderr
    assert re.search(match, lines[0]), lines[0]
