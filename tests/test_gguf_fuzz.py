"""Reading any GGUF safely: property-based fuzzing of the header reader and the profile built on it.

Seeds are real files written by gguf's writer (little- and big-endian, a small llama, a hybrid
qwen35 with per-layer arrays, an MoE). Mutations: flipped bytes, truncation at every byte of
the header, every recorded field (counts, lengths, value types, array element types, tensor
dims, shapes, types, offsets) overwritten with extreme values, wrong metadata value types
written through the writer itself, and big-endian files (read, never rejected as "not GGUF").

Properties: the reader raises nothing but its own :class:`GGUFError`, never hangs (a deadline
per example), and its memory stays bounded by the file's size (tracemalloc). Over 10,000
examples in all; about a minute on a 2-core machine.
"""

from __future__ import annotations

import struct
import sys
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import ClassVar

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtuner.core.model import gguf_header as H
from kvtuner.core.model.gguf_header import GGUFError
from kvtuner.core.model.gguf_write import add_transformer_keys, write_sparse_gguf
from kvtuner.core.model.profile import ModelProfile, _build
from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import ModelSpec, write_model

FAST = settings(
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)

SEEDS: dict[str, bytes] = {}
FIELDS: dict[str, list[tuple[int, int]]] = {}  # seed -> [(offset, width)] of every field the reader unpacked


def _write(tmp: Path, name: str, spec: ModelSpec, *, big: bool = False) -> bytes:
    path = tmp / f"{name}.gguf"
    if big:
        # gguf's writer in big-endian: the whole file byte-swapped after the magic
        w = gguf.GGUFWriter(str(path), spec.arch, endianess=gguf.GGUFEndian.BIG)
        add_transformer_keys(w, spec.n_layer, spec.n_ctx_train, spec.n_embd, spec.n_ff, spec.n_head, spec.n_head_kv)
        w.add_vocab_size(spec.n_vocab)
        w.add_array(f"{spec.arch}.attention.sliding_window_pattern", [True, False])
        w.add_string("general.name", "big-endian")
        write_sparse_gguf(
            path,
            w,
            [("token_embd.weight", (spec.n_embd, spec.n_vocab), "F32"), ("output_norm.weight", (spec.n_embd,), "F32")],
        )
    else:
        write_model(path, spec)
    return path.read_bytes()


class _Recorder(H._Cursor):
    """A cursor that records where every field it reads starts and how wide it is."""

    log: ClassVar[list[tuple[int, int]]] = []

    def unpack(self, fmt, what):
        _Recorder.log.append((self.pos, struct.calcsize(fmt)))
        return super().unpack(fmt, what)


@pytest.fixture(scope="module", autouse=True)
def seeds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    small = ModelSpec(n_layer=2, n_embd=32, n_head=4, n_head_kv=2, n_ff=64, n_vocab=64)
    SEEDS["llama"] = _write(tmp, "llama", small)
    SEEDS["qwen35"] = _write(
        tmp,
        "qwen35",
        F.qwen35(
            n_layer=4,
            E=64,
            n_head=2,
            n_head_kv=1,
            head=32,
            n_ff=64,
            V=64,
            d_inner=64,
            d_state=16,
            n_group=2,
            dt_rank=4,
            n_mtp=1,
        ),
    )
    SEEDS["moe"] = _write(
        tmp,
        "moe",
        F.glm4moe(
            n_layer=2, E=64, n_head=2, n_head_kv=1, head=32, n_ff=64, n_expert=4, n_expert_used=2, n_ff_exp=32, V=64
        ),
    )
    SEEDS["big"] = _write(tmp, "big", small, big=True)
    orig = H._Cursor
    for name, data in SEEDS.items():
        _Recorder.log = []
        H._Cursor = _Recorder  # type: ignore[misc]
        try:
            H._parse(data, len(data), Path(name), 0)
        finally:
            H._Cursor = orig  # type: ignore[misc]
        FIELDS[name] = list(_Recorder.log)
    yield


def _read(data: bytes, name: str = "fuzz.gguf") -> None:
    """The reader and the profile on ``data``: GGUFError is the only allowed failure."""
    try:
        header = H._parse(data, len(data), Path(name), 0)
    except GGUFError as exc:
        assert "\n" not in str(exc)
        return
    try:
        _build(Path(name), [Path(name)], [header])
    except GGUFError as exc:
        assert "\n" not in str(exc)


def test_seeds_are_read():
    for name, data in SEEDS.items():
        header = H._parse(data, len(data), Path(name), 0)
        assert header.big_endian == (name == "big")
        m = _build(Path(name), [Path(name)], [header])
        assert m.n_layer >= 2


def test_big_endian_is_read_not_rejected(tmp_path):
    data = SEEDS["big"]
    path = tmp_path / "be.gguf"
    path.write_bytes(data)
    m = ModelProfile.from_gguf(path)
    assert (m.n_layer, m.n_embd, m.n_vocab, m.name) == (2, 32, 64, "big-endian")
    assert any("big-endian" in w for w in m.warnings) == (sys.byteorder == "little")


@pytest.mark.parametrize("seed", ["llama", "qwen35", "moe", "big"])
def test_truncated_at_every_byte_of_the_header(seed):
    data = SEEDS[seed]
    end = max(o + w for o, w in FIELDS[seed])
    for cut in range(end + 1):
        _read(data[:cut])


SEED_NAMES = st.sampled_from(["llama", "qwen35", "moe", "big"])


@pytest.mark.slow
@settings(FAST, max_examples=4500)
@given(SEED_NAMES, st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=8))
def test_flipped_bytes(seed, flips):
    data = bytearray(SEEDS[seed])
    end = max(o + w for o, w in FIELDS[seed])
    for pos, xor in flips:
        data[pos % end] ^= xor
    _read(bytes(data))


EXTREMES = st.sampled_from(
    [0, 1, 2, 3, 7, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]
)


@pytest.mark.slow
@settings(FAST, max_examples=4500)
@given(SEED_NAMES, st.data())
def test_every_field_at_extreme_values(seed, data):
    """Counts, lengths, value types, dimensions, shapes, offsets: each recorded field overwritten."""
    buf = bytearray(SEEDS[seed])
    order = ">" if seed == "big" else "<"
    for _ in range(data.draw(st.integers(1, 3))):
        off, width = data.draw(st.sampled_from(FIELDS[seed]))
        value = data.draw(EXTREMES) % (1 << (8 * width))
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
        struct.pack_into(order + fmt, buf, off, value)
    _read(bytes(buf))


def _kv_value(draw) -> tuple[str, object]:
    kind = draw(
        st.sampled_from(
            [
                "u32",
                "i32",
                "f32",
                "bool",
                "str",
                "arr_int",
                "arr_str",
                "arr_bool",
                "u64",
                "i8",
                "arr_float",
                "empty_str",
            ]
        )
    )
    if kind == "u32":
        return kind, draw(st.integers(0, (1 << 32) - 1))
    if kind == "i32":
        return kind, draw(st.integers(-(1 << 31), (1 << 31) - 1))
    if kind == "u64":
        return kind, draw(st.integers(0, (1 << 64) - 1))
    if kind == "i8":
        return kind, draw(st.integers(-128, 127))
    if kind == "f32":
        return kind, draw(st.floats(width=32, allow_nan=True))
    if kind == "bool":
        return kind, draw(st.booleans())
    if kind in ("str", "empty_str"):
        return kind, "" if kind == "empty_str" else draw(st.text(max_size=20))
    if kind == "arr_str":
        return kind, draw(st.lists(st.text(max_size=5), min_size=1, max_size=6))
    if kind == "arr_bool":
        return kind, draw(st.lists(st.booleans(), min_size=1, max_size=70))
    if kind == "arr_float":
        return kind, draw(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=6))
    return kind, draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=1, max_size=70))


KEYS = [
    "{a}.block_count",
    "{a}.embedding_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.feed_forward_length",
    "{a}.context_length",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.attention.sliding_window",
    "{a}.attention.sliding_window_pattern",
    "{a}.nextn_predict_layers",
    "{a}.full_attention_interval",
    "{a}.attention.recurrent_layers",
    "{a}.ssm.conv_kernel",
    "{a}.ssm.inner_size",
    "{a}.ssm.state_size",
    "{a}.ssm.group_count",
    "{a}.attention.shared_kv_layers",
    "{a}.vocab_size",
    "{a}.expert_count",
    "general.architecture",
    "general.name",
    "general.alignment",
    "general.type",
    "general.file_type",
    "{a}.attention.key_length_mla",
    "{a}.shortconv.l_cache",
    "split.count",
]
ARCHS = [
    "llama",
    "qwen35",
    "gemma4",
    "gemma3n",
    "llama4",
    "nemotron_h",
    "lfm2",
    "falcon-h1",
    "granitehybrid",
    "glm4moe",
    "gpt-oss",
    "mamba",
    "deepseek2",
    "qwen3next",
    "gemma3",
    "unknown-arch",
]


@st.composite
def _wrong_typed_model(draw):
    arch = draw(st.sampled_from(ARCHS))
    spec = ModelSpec(arch=arch, n_layer=draw(st.integers(1, 6)), n_embd=32, n_head=4, n_head_kv=2, n_ff=64, n_vocab=64)
    extra = {}
    for _ in range(draw(st.integers(1, 5))):
        key = draw(st.sampled_from(KEYS)).format(a=arch)
        extra[key] = _kv_value(draw)
    return spec, extra


@pytest.mark.slow
@settings(FAST, max_examples=1500)
@given(_wrong_typed_model())
def test_wrong_value_types(tmp_path_factory, case):
    """Metadata of every type where the reader expects another, written by gguf's own writer."""
    spec, extra = case
    path = tmp_path_factory.getbasetemp() / "wrong.gguf"
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_block_count(spec.n_layer)
    w.add_embedding_length(spec.n_embd)
    w.add_head_count(spec.n_head)
    w.add_vocab_size(spec.n_vocab)
    adders = {
        "u32": w.add_uint32,
        "i32": w.add_int32,
        "f32": w.add_float32,
        "bool": w.add_bool,
        "str": w.add_string,
        "empty_str": w.add_string,
        "u64": w.add_uint64,
        "i8": w.add_int8,
    }
    for key, (kind, value) in extra.items():
        if kind.startswith("arr"):
            w.add_array(key, value)
        else:
            adders[kind](key, value)
    write_sparse_gguf(path, w, [("token_embd.weight", (32, 64), "F32")])
    data = path.read_bytes()
    _read(data)


@pytest.mark.slow
def test_memory_stays_bounded_on_huge_counts():
    """Counts and lengths claiming terabytes: refused from the file size, never allocated."""
    tracemalloc.start()
    try:
        for seed in SEEDS:
            order = ">" if seed == "big" else "<"
            for off, width in FIELDS[seed]:
                if width != 8:
                    continue
                for value in ((1 << 63) - 1, (1 << 40), (1 << 32) + 7):
                    buf = bytearray(SEEDS[seed])
                    struct.pack_into(order + "Q", buf, off, value)
                    _read(bytes(buf))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak} bytes"
