"""Golden outputs for every export target, written out in full.

Sources of each flag/key (checked against the code, not copied from blog posts):
- llama-server/llama-cli: llama.cpp common/arg.cpp vendored by llama-cpp-python 0.3.36
  (-m, -c, -ngl N|all, --fit on|off, -fa on|off|auto, -ctk/-ctv, -np, -b, -ub, --swa-full,
  -kvu, -nkvo, -ot PATTERN=BUFT, -lm none). Layer placement: llama-model.cpp
  ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``; the output layer is offloaded first.
- llama-cpp-python: Llama.__init__ of 0.3.36 (flash_attn bool, swa_full, type_k/type_v ggml ids:
  f16 1, q8_0 8, q4_0 2 from ggml.h enum ggml_type).
- Ollama: parser/parser.go (FROM, PARAMETER, quoted values), runner: n_ubatch = num_batch,
  n_ctx = num_ctx x OLLAMA_NUM_PARALLEL; server env OLLAMA_KV_CACHE_TYPE / OLLAMA_FLASH_ATTENTION.
- koboldcpp: koboldcpp.py 1.102 argparse destinations (model_param, contextsize, gpulayers,
  flashattention, quantkv 0/1/2, lowvram = -nkvo, usemmap, useswa, batchsize, overridetensors).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtuner.core.export import (
    TARGETS,
    ExportError,
    GpuFingerprint,
    MachineFingerprint,
    ModelIdentity,
    export,
    kv_placement,
)
from kvtuner.core.export.koboldcpp import nearest_shared_kv_type
from kvtuner.core.plan.config import PlanConfig

MODEL = Path("/models/gemma-3-270m-q4_k_m.gguf")  # never read: plain configs need no header
IDENT = ModelIdentity("gemma-3-270m-q4_k_m.gguf", 253_113_024, "ab" * 32, "gemma3", 18, "Gemma 3 270m")
Q8_FA = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")
# every option away from its default; KV on the host (-nkvo)
BUSY = PlanConfig(
    n_ctx=16384,
    n_gpu_layers=10,
    kv_gpu_layers=0,
    type_k="q8_0",
    type_v="f16",
    flash_attn="off",
    n_seq=4,
    n_ubatch=256,
    n_batch=1024,
    swa_full=True,
    kv_unified=True,
    use_mmap=False,
)
# all 18 layers on the GPU, KV of only the last 12 there: -ngl 13 + -ot for layers 0..5
SPLIT = PlanConfig(n_ctx=32768, kv_gpu_layers=12, type_k="q4_0", type_v="q4_0", flash_attn="on")


# ---------------------------------------------------------------------------------- placement
@pytest.mark.parametrize(
    "ngl, kv, n_layer, expected",
    [
        (-1, None, 18, ("gpu", -1, ())),
        (-1, 0, 18, ("host", -1, ())),
        (-1, 18, 18, ("gpu", -1, ())),  # all offloaded layers keep KV: the ordinary case
        (-1, 12, 18, ("split", 13, (0, 1, 2, 3, 4, 5))),
        (15, 10, 18, ("split", 11, (4, 5, 6, 7))),  # ngl 15 = output + layers 4..17
        (19, 17, 18, ("split", 18, (0,))),  # ngl n_layer+1 = all
        (5, 4, 18, ("gpu", 5, ())),
    ],
)
def test_kv_placement(ngl, kv, n_layer, expected):
    p = kv_placement(PlanConfig(n_gpu_layers=ngl, kv_gpu_layers=kv), lambda: n_layer)
    assert (p.mode, p.n_gpu_layers, p.override_layers) == expected


def test_kv_placement_too_many_kv_layers_says_what_to_change():
    with pytest.raises(ExportError, match=r"--kv-gpu-layers 9 exceeds the 4 repeating layers offloaded by --ngl 5"):
        kv_placement(PlanConfig(n_gpu_layers=5, kv_gpu_layers=9), lambda: 18)


def test_plain_configs_never_read_the_model():
    def boom() -> int:
        raise AssertionError("n_layer must not be needed")

    for cfg in (Q8_FA, BUSY):
        kv_placement(cfg, boom)
    # and export() with a model path that does not exist works for every non-profile target
    for target in TARGETS:
        if target != "profile":
            export(target, MODEL, Q8_FA)


# ---------------------------------------------------------------------------------- llama-server
def test_llama_server_q8_fa():
    r = export("llama-server", MODEL, Q8_FA)
    assert r.text == (
        "llama-server -m /models/gemma-3-270m-q4_k_m.gguf -c 8192 -ngl all --fit off -fa on "
        "-ctk q8_0 -ctv q8_0 -np 1 -b 2048 -ub 512\n"
    )
    assert r.argv[:3] == ("llama-server", "-m", str(MODEL))
    assert r.filename_suggestion == "gemma-3-270m-q4_k_m.llama-server.sh"
    assert not r.experimental
    assert any("--fit" in note for note in r.limitations)


def test_llama_server_every_option():
    r = export("llama-server", MODEL, BUSY)
    assert r.text == (
        "llama-server -m /models/gemma-3-270m-q4_k_m.gguf -c 16384 -ngl 10 --fit off -fa off "
        "-ctk q8_0 -ctv f16 -np 4 -b 1024 -ub 256 --swa-full -kvu -nkvo -lm none\n"
    )


def test_llama_server_partial_kv_split_is_experimental():
    r = export("llama-server", MODEL, SPLIT, model=IDENT, gpu_buffer_type="CUDA0")
    assert r.text == (
        "llama-server -m /models/gemma-3-270m-q4_k_m.gguf -c 32768 -ngl 13 --fit off -fa on "
        "-ctk q4_0 -ctv q4_0 -np 1 -b 2048 -ub 512 -ot '^blk\\.(0|1|2|3|4|5)\\.=CUDA0'\n"
    )
    assert r.argv[-1] == "^blk\\.(0|1|2|3|4|5)\\.=CUDA0"
    assert r.experimental
    assert any(n.startswith("Partial KV split") and "checked on a GPU" in n for n in r.limitations)


def test_llama_cli_has_no_kv_unified():
    r = export("llama-cli", MODEL, BUSY)
    assert r.argv[0] == "llama-cli" and "-kvu" not in r.argv
    assert any("llama-cli has no --kv-unified" in n for n in r.limitations)


def test_bad_gpu_buffer_type():
    with pytest.raises(ExportError, match=r"not a llama\.cpp buffer name"):
        export("llama-server", MODEL, SPLIT, model=IDENT, gpu_buffer_type="CUDA0,x=CPU")


# ---------------------------------------------------------------------------------- llama-cpp-python
def test_llama_cpp_python_json():
    r = export("llama-cpp-python-json", MODEL, Q8_FA)
    assert json.loads(r.text) == {
        "model_path": "/models/gemma-3-270m-q4_k_m.gguf",
        "n_ctx": 8192,
        "n_gpu_layers": -1,  # Llama(): -1 = all (0x7FFFFFFF)
        "n_batch": 2048,
        "n_ubatch": 512,
        "flash_attn": True,
        "offload_kqv": True,
        "swa_full": False,  # must be explicit: Llama() leaves the C default, which is TRUE
        "type_k": 8,  # GGML_TYPE_Q8_0
        "type_v": 8,
        "use_mmap": True,
    }
    assert r.limitations == ()


def test_llama_cpp_python_snippet_golden():
    r = export("llama-cpp-python", MODEL, Q8_FA)
    assert (
        r.text
        == """\
# kvtuner export for llama-cpp-python (tested with 0.3.36): pip install llama-cpp-python
from llama_cpp import Llama

KWARGS = {
    'model_path': '/models/gemma-3-270m-q4_k_m.gguf',
    'n_ctx': 8192,
    'n_gpu_layers': -1,
    'n_batch': 2048,
    'n_ubatch': 512,
    'flash_attn': True,
    'offload_kqv': True,
    'swa_full': False,
    'type_k': 8,  # q8_0 (ggml type id)
    'type_v': 8,  # q8_0 (ggml type id)
    'use_mmap': True,
}

if __name__ == "__main__":
    llm = Llama(**KWARGS, verbose=False)
    out = llm.create_completion("The capital of France is", max_tokens=8)
    print(out["choices"][0]["text"])
"""
    )
    compile(r.text, "snippet.py", "exec")


def test_llama_cpp_python_states_what_llama_cannot_express():
    busy = json.loads(export("llama-cpp-python-json", MODEL, BUSY).text)
    assert busy["offload_kqv"] is False and busy["use_mmap"] is False and busy["swa_full"] is True
    assert busy["flash_attn"] is False and busy["type_v"] == 1
    notes = export("llama-cpp-python", MODEL, BUSY).limitations
    assert any("one sequence" in n for n in notes)
    split = export("llama-cpp-python-json", MODEL, SPLIT, model=IDENT)
    assert json.loads(split.text)["n_gpu_layers"] == 13
    assert any("no tensor overrides" in n for n in split.limitations)
    auto = export("llama-cpp-python-json", MODEL, PlanConfig(flash_attn="auto"))
    assert json.loads(auto.text)["flash_attn"] is True
    assert any("'auto' is written as True" in n for n in auto.limitations)


# ---------------------------------------------------------------------------------- ollama
def test_ollama_golden():
    r = export("ollama", MODEL, Q8_FA)
    assert (
        r.text
        == """\
# kvtuner export for Ollama.
# 1. Start the Ollama server with this environment:
#      OLLAMA_KV_CACHE_TYPE=q8_0 OLLAMA_FLASH_ATTENTION=1 OLLAMA_NUM_PARALLEL=1 ollama serve
# 2. Create the model from this file:
#      ollama create gemma-3-270m-q4_k_m-kvtuner -f Modelfile
# NOTE: OLLAMA_* settings apply to the whole Ollama server: set them where 'ollama serve' starts (systemd unit, launchd, Windows environment) and restart it.
FROM "/models/gemma-3-270m-q4_k_m.gguf"
PARAMETER num_ctx 8192
PARAMETER num_gpu 999
PARAMETER num_batch 512
"""
    )
    assert r.env == {"OLLAMA_KV_CACHE_TYPE": "q8_0", "OLLAMA_FLASH_ATTENTION": "1", "OLLAMA_NUM_PARALLEL": "1"}
    assert r.filename_suggestion == "Modelfile"


def test_ollama_flags_what_it_cannot_do():
    r = export("ollama", MODEL, BUSY)
    assert "PARAMETER num_ctx 4096\n" in r.text  # 16384 tokens over 4 parallel requests
    assert "PARAMETER num_gpu 10\n" in r.text
    assert "PARAMETER num_batch 256\n" in r.text
    assert "PARAMETER use_mmap false\n" in r.text
    # K q8_0 + V f16 = 3.06 B/elem -> q8_0 for both (2.13): never more memory than planned
    assert r.env["OLLAMA_KV_CACHE_TYPE"] == "q8_0"
    text = " ".join(r.limitations)
    for phrase in ("one KV cache type for K and V", "no -nkvo", "--swa-full cannot", "no unified KV"):
        assert phrase in text, phrase
    split = export("ollama", MODEL, SPLIT, model=IDENT)
    assert "PARAMETER num_gpu 13\n" in split.text
    assert any("cannot split weights and KV" in n for n in split.limitations)


# ---------------------------------------------------------------------------------- koboldcpp
def test_koboldcpp_golden():
    r = export("koboldcpp", MODEL, Q8_FA)
    assert json.loads(r.text) == {
        "model_param": "/models/gemma-3-270m-q4_k_m.gguf",
        "contextsize": 8192,
        "gpulayers": 999,  # -1 would mean auto-guess in koboldcpp
        "flashattention": True,
        "quantkv": 1,  # 0 f16, 1 q8, 2 q4
        "lowvram": False,
        "usemmap": True,
        "useswa": True,
        "batchsize": 512,
        "blasbatchsize": 512,
    }
    assert r.filename_suggestion == "gemma-3-270m-q4_k_m.kcpps"


def test_koboldcpp_flags_unsupported_kv_types():
    r = export("koboldcpp", MODEL, BUSY)
    d = json.loads(r.text)
    # FA off: koboldcpp quantizes only K, so quantkv 1 gives exactly K q8_0 / V f16
    assert (d["quantkv"], d["flashattention"], d["lowvram"], d["usemmap"], d["useswa"]) == (
        1,
        False,
        True,
        False,
        False,
    )
    assert not any("quantkv offers only" in n for n in r.limitations)
    odd = export("koboldcpp", MODEL, PlanConfig(type_k="q5_1", type_v="iq4_nl", flash_attn="on"))
    assert json.loads(odd.text)["quantkv"] == 2
    assert any("K q5_1 / V iq4_nl becomes K q4_0 / V q4_0" in n for n in odd.limitations)
    split = json.loads(export("koboldcpp", MODEL, SPLIT, model=IDENT).text)
    assert split["gpulayers"] == 13 and split["overridetensors"] == "^blk\\.(0|1|2|3|4|5)\\.=CUDA0"
    with pytest.raises(ExportError, match="up to 262144"):
        export("koboldcpp", MODEL, PlanConfig(n_ctx=300000))


@pytest.mark.parametrize(
    "k, v, expected",
    [
        ("q8_0", "q8_0", "q8_0"),
        ("f16", "f16", "f16"),
        ("f32", "f32", "f16"),
        ("bf16", "bf16", "f16"),  # same size, other format
        ("q8_0", "q4_0", "q4_0"),  # 1.625 B/elem for both: q8_0 pair (2.125) would need more
        ("f16", "q8_0", "q8_0"),
        ("q5_1", "q5_1", "q4_0"),
        ("iq4_nl", "iq4_nl", "q4_0"),
        ("q4_1", "q4_0", "q4_0"),
    ],
)
def test_nearest_shared_kv_type(k, v, expected):
    assert nearest_shared_kv_type(k, v, ("f16", "q8_0", "q4_0")) == expected


# ---------------------------------------------------------------------------------- profile
def test_profile_golden():
    machine = MachineFingerprint(
        "Linux 6.8.0",
        "x86_64",
        "AMD Ryzen 7 5800X",
        32 * 2**30,
        (GpuFingerprint("NVIDIA GeForce RTX 3060", 12 * 2**30),),
    )
    r = export(
        "profile",
        MODEL,
        Q8_FA,
        model=IDENT,
        machine=machine,
        llama_cpp_build_text="llama-cpp-python 0.3.36",
        measured={"decode_tok_s": 41.5, "peak_vram_bytes": 1234, "load_s": None},
    )
    d = json.loads(r.text)
    d.pop("created_utc")
    d.pop("kvtuner_version")
    assert d == {
        "kvtuner_profile": 1,
        "model": {
            "path": "/models/gemma-3-270m-q4_k_m.gguf",
            "file_name": "gemma-3-270m-q4_k_m.gguf",
            "file_bytes": 253113024,
            "header_sha256": "ab" * 32,
            "architecture": "gemma3",
            "n_layer": 18,
            "name": "Gemma 3 270m",
        },
        "config": Q8_FA.to_dict(),
        "machine": {
            "os": "Linux 6.8.0",
            "arch": "x86_64",
            "cpu": "AMD Ryzen 7 5800X",
            "ram_total_bytes": 32 * 2**30,
            "gpus": [{"name": "NVIDIA GeForce RTX 3060", "total_bytes": 12 * 2**30}],
            "fingerprint_id": machine.fingerprint_id,
        },
        "llama_cpp_build": "llama-cpp-python 0.3.36",
        "measured": {"decode_tok_s": 41.5, "peak_vram_bytes": 1234},
        "note": None,
    }
    assert r.filename_suggestion == "gemma-3-270m-q4_k_m.kvtuner.json"


def test_profile_of_unreadable_model_is_one_line_error(tmp_path):
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"hello")
    with pytest.raises(ExportError) as ei:
        export("profile", bad, Q8_FA)
    assert "\n" not in str(ei.value) and "not.gguf" in str(ei.value)


def test_unknown_target():
    with pytest.raises(ExportError, match="unknown export format 'vllm'"):
        export("vllm", MODEL, Q8_FA)


def test_bad_measured_value():
    with pytest.raises(ExportError, match="decode_tok_s must be a finite number"):
        export("profile", MODEL, Q8_FA, model=IDENT, measured={"decode_tok_s": float("nan")})


def test_ollama_and_koboldcpp_batch_is_the_effective_ubatch():
    """llama.cpp clamps -ub to -b; Ollama's num_batch is both, koboldcpp's batchsize the ubatch:
    writing -ub 3000 with -b 256 would size a compute buffer 12x what was planned."""
    cfg = PlanConfig(n_batch=256, n_ubatch=3000)
    assert "PARAMETER num_batch 256\n" in export("ollama", MODEL, cfg).text
    kc = json.loads(export("koboldcpp", MODEL, cfg).text)
    assert kc["batchsize"] == kc["blasbatchsize"] == 256


def test_ollama_nkvo_note_only_when_layers_are_offloaded(default_model):
    """With -ngl 0 or 1 no repeating layer is on the GPU, so -nkvo changes nothing for Ollama."""
    from kvtuner.core.export import export as _export
    from kvtuner.core.plan.config import PlanConfig as _PlanConfig

    def notes(ngl):
        return " ".join(_export("ollama", default_model, _PlanConfig(n_gpu_layers=ngl, kv_gpu_layers=0)).limitations)

    assert "cannot keep the KV cache in RAM" not in notes(0)
    assert "cannot keep the KV cache in RAM" not in notes(1)
    assert "cannot keep the KV cache in RAM" in notes(10)
