"""MoE experts in host RAM: --n-cpu-moe / --cpu-moe / -ot planned tensor by tensor,
advised, passed to a real llama.cpp and exported.

The byte checks read the GGUF tensor table with gguf-py's own reader (not kvtuner's), so the plan
is compared against the file, not against itself.
"""

from __future__ import annotations

import dataclasses
import json
import re

import gguf
import pytest

from kvtuner.cli import main
from kvtuner.core.advice.advisor import advise
from kvtuner.core.export import export
from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import ConfigError, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.placement import FFN_EXPS_REGEX, placement_for, tensor_overrides
from kvtuner.core.units import GiB
from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import ModelSpec, write_model

MXFP4 = gguf.GGMLQuantizationType.MXFP4
Q8_0 = gguf.GGMLQuantizationType.Q8_0
#: llama.cpp's own regex for --n-cpu-moe, re-typed from common/common.h (LLM_FFN_EXPS_REGEX)
EXPS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")


def gpt_oss_20b_mxfp4() -> ModelSpec:
    """gpt-oss-20b's shapes with MXFP4 experts and Q8_0 for the other matrices (norms, biases, sinks
    and the router F32): 11.27 GiB of tensors, the size llama-bench prints for the published
    "gpt-oss 20B MXFP4 MoE" file (20.91 B parameters)."""
    s = F.gpt_oss()
    rows = [
        (n, sh, MXFP4 if n.endswith("_exps.weight") else (Q8_0 if t == gguf.GGMLQuantizationType.F16 else t))
        for n, sh, t in s.tensors
    ]
    return dataclasses.replace(s, tensors=rows)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("moe") / "gpt-oss-20b-shape.gguf", gpt_oss_20b_mxfp4())


@pytest.fixture(scope="module")
def small_moe(tmp_path_factory):
    spec = ModelSpec(
        arch="qwen3moe",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_vocab=1024,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=128,
        name="tiny qwen3moe",
    )
    return write_model(tmp_path_factory.mktemp("moe-small") / "tiny-qwen3moe.gguf", spec)


def _table(path) -> dict[str, int]:
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}


def test_n_cpu_moe_moves_exactly_the_expert_tensors_of_the_first_layers(gpt_oss, capsys):
    assert main(
        ["plan", str(gpt_oss), "--gpu-mem", "8G", "--n-cpu-moe", "12", "-fa", "on", "--json", "--no-probe"]
    ) in (0, 1)
    d = json.loads(capsys.readouterr().out)
    table = _table(gpt_oss)
    want = {n: b for n, b in table.items() if EXPS.search(n) and int(n.split(".")[1]) < 12}
    assert len(want) == 12 * 6  # gate/up/down weights and biases of 12 layers
    assert {m["name"]: m["bytes"] for m in d["moved_tensors"]} == want
    assert all((m["from"], m["to"]) == ("CUDA0", "CPU") for m in d["moved_tensors"])
    gpu, host = d["devices"]
    all_exps = sum(b for n, b in table.items() if EXPS.search(n))
    assert host["expert_bytes"] == sum(want.values()) and host["expert_layers"] == 12
    assert gpu["expert_bytes"] == all_exps - sum(want.values()) and gpu["expert_layers"] == 12
    # every byte of the file is somewhere, once: embeddings on the host, the rest on the GPU
    layers_and_output = sum(b for n, b in table.items() if n != "token_embd.weight")
    assert gpu["weights_bytes"] == layers_and_output - sum(want.values())
    assert host["weights_bytes"] == table["token_embd.weight"] + sum(want.values())
    assert d["tensor_overrides"][0] == {"pattern": r"blk\.0" + FFN_EXPS_REGEX, "buffer": "CPU"}
    # 12 layers' experts (4.74 GiB) leave 5.95 GiB of weights on the card, 7.18 GiB in all with KV,
    # compute and the CUDA context: it fits the 8 GiB card (llmfit PR #775 ran it so on an RTX 2080)
    assert gpu["total_bytes"] <= gpu["capacity_bytes"] == 8 * GiB
    assert sum(table.values()) == pytest.approx(11.27 * GiB, abs=0.005 * GiB)


def test_advisor_offers_the_smallest_fitting_n_cpu_moe_before_any_ngl_cut(gpt_oss):
    model = ModelProfile.from_gguf(gpt_oss)
    gpus, host = [what_if_gpu(8 * GiB)], HostSpec(total_bytes=64 * GiB, available_bytes=60 * GiB)
    plan = plan_memory(model, PlanConfig(flash_attn="on"), gpus, host)
    (oom,) = [a for a in advise(plan) if a.id == "vram-oom"]
    n = oom.fix["n_cpu_moe"]
    assert oom.fix == {"n_cpu_moe": n} and "RAM" in oom.message
    limit = 8 * GiB - 1 * GiB  # the advisor's 1 GiB margin
    assert plan_memory(model, PlanConfig(flash_attn="on", n_cpu_moe=n), gpus, host).gpus[0].total_bytes <= limit
    assert plan_memory(model, PlanConfig(flash_attn="on", n_cpu_moe=n - 1), gpus, host).gpus[0].total_bytes > limit
    assert oom.fix_label == f"Use experts of {n} layers on the CPU"


def test_cpu_moe_moves_every_expert_and_ot_takes_the_first_match(gpt_oss):
    model = ModelProfile.from_gguf(gpt_oss)
    table = _table(gpt_oss)
    all_exps = sum(b for n, b in table.items() if EXPS.search(n))
    plan = plan_memory(model, PlanConfig(cpu_moe=True), [what_if_gpu(24 * GiB)])
    assert plan.host.expert_bytes == all_exps and plan.gpus[0].expert_bytes == 0
    # an earlier -ot keeps layer 0's experts on the GPU although --cpu-moe matches them too
    plan = plan_memory(model, PlanConfig(cpu_moe=True, tensor_overrides=(r"blk\.0\.=CUDA0",)), [what_if_gpu(24 * GiB)])
    layer0 = sum(b for n, b in table.items() if EXPS.search(n) and n.startswith("blk.0."))
    assert plan.gpus[0].expert_bytes == layer0 and plan.host.expert_bytes == all_exps - layer0
    # without a GPU the overrides change nothing, and the plan says so
    cpu = plan_memory(model, PlanConfig(n_cpu_moe=4))
    assert cpu.host.weights_bytes == plan_memory(model, PlanConfig()).host.weights_bytes
    assert any("no GPU: tensor overrides" in w for w in cpu.warnings)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-ot", "(blk=CPU"], "invalid regular expression"),
        (["-ot", "exps=GPU0"], "unknown buffer type 'GPU0'"),
        (["-ot", "exps"], "write PATTERN=BUFFER"),
        (["--n-cpu-moe", "-1"], "--n-cpu-moe must be"),
    ],
)
def test_bad_overrides_are_one_line_and_exit_2(small_moe, capsys, argv, message):
    assert main(["plan", str(small_moe), "--no-probe", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_override_to_a_gpu_that_is_not_planned(small_moe, capsys):
    assert main(["plan", str(small_moe), "--no-probe", "--gpu-mem", "8G", "-ot", "exps=CUDA1"]) == 2
    assert "no such GPU is planned" in capsys.readouterr().err


def test_an_override_may_name_the_gpu_as_its_backend_does(small_moe, capsys):
    """A ROCm card's buffer is "ROCm0" in a HIP build's -ot (what an attached server's command
    says): it plans as the card's slot; on a CUDA card the same name is no planned GPU."""
    from kvtuner.core.hardware.specs import catalogue_gpu

    model = ModelProfile.from_gguf(small_moe)
    rocm = plan_memory(
        model, PlanConfig(n_cpu_moe=99, tensor_overrides=(r"blk\.0\.=ROCm0",)), [catalogue_gpu("RX 7900 XTX")]
    )
    slot = plan_memory(
        model, PlanConfig(n_cpu_moe=99, tensor_overrides=(r"blk\.0\.=CUDA0",)), [catalogue_gpu("RX 7900 XTX")]
    )
    assert rocm.gpus[0].expert_bytes == slot.gpus[0].expert_bytes > 0
    assert main(["plan", str(small_moe), "--no-probe", "--gpu", "RTX 4090", "-ot", "exps=ROCm0"]) == 2
    assert "no such GPU is planned (planned: CUDA0)" in capsys.readouterr().err


def test_overrides_are_in_llama_cpp_order_and_comma_lists_split():
    cfg = PlanConfig(tensor_overrides=("a=CPU", "b=CUDA0"), cpu_moe=True, n_cpu_moe=2, kv_gpu_layers=3)
    ot = tensor_overrides(cfg)
    assert ot == (
        ("a", "CPU"),
        ("b", "CUDA0"),
        (FFN_EXPS_REGEX, "CPU"),
        (r"blk\.0" + FFN_EXPS_REGEX, "CPU"),
        (r"blk\.1" + FFN_EXPS_REGEX, "CPU"),
    )
    p = placement_for(cfg, 10)
    assert p.weight_overrides[:5] == ot and p.weight_overrides[5][1] == "CUDA0"  # the KV split's comes last
    from kvtuner.cli import build_parser
    from kvtuner.cli.args import config_from_args

    args = build_parser().parse_args(
        ["plan", "-ot", "x=CPU,y=CPU", "--override-tensor", "z=CPU", "-cmoe", "-ncmoe", "3"]
    )
    cfg = config_from_args(args)
    assert cfg.tensor_overrides == ("x=CPU", "y=CPU", "z=CPU") and cfg.cpu_moe and cfg.n_cpu_moe == 3
    assert PlanConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ConfigError):
        PlanConfig(tensor_overrides=("x=cuda0",))


def test_exports_carry_the_flags(small_moe):
    cfg = PlanConfig(n_ctx=2048, n_cpu_moe=2, tensor_overrides=(r"blk\.3\.ffn_(up|down)_exps=CPU",), flash_attn="on")
    server = export("llama-server", small_moe, cfg)
    assert "--n-cpu-moe 2" in server.text and "-ot 'blk\\.3\\.ffn_(up|down)_exps=CPU'" in server.text
    assert server.argv.index("-ot") < server.argv.index("--n-cpu-moe")  # llama.cpp's order: first match wins
    assert "--cpu-moe" in export("llama-cli", small_moe, PlanConfig(cpu_moe=True)).text
    kobold = json.loads(export("koboldcpp", small_moe, cfg).text)
    assert kobold["moecpu"] == 2 and kobold["overridetensors"] == r"blk\.3\.ffn_(up|down)_exps=CPU"
    py = export("llama-cpp-python-json", small_moe, cfg)
    assert any("Llama() has no tensor overrides" in n for n in py.limitations)
    snippet = export("llama-cpp-python", small_moe, cfg).text
    assert "tensor_buft_overrides" in snippet and "OVERRIDES = " in snippet
    ollama = export("ollama", small_moe, cfg)
    assert any("not expressible" in n for n in ollama.limitations)


@pytest.mark.llama
def test_runner_passes_the_overrides_to_llama_cpp(small_moe):
    """On this CPU-only build the overrides to CPU are no-ops, but they must reach llama.cpp and load."""
    from kvtuner.runner.dryrun import dry_run

    cfg = PlanConfig(n_ctx=512, n_cpu_moe=2, tensor_overrides=("output=CPU",), flash_attn="on")
    r = dry_run(small_moe, cfg)
    plain = dry_run(small_moe, PlanConfig(n_ctx=512, flash_attn="on"))
    # a CPU-only build: the same buffers with and without the overrides (every weight is on the CPU)
    assert (r.compute_mib, r.output_mib, r.kv_caches) == (plain.compute_mib, plain.output_mib, plain.kv_caches)
    assert set(r.compute_mib) == {"CPU"}


@pytest.fixture(scope="module")
def granite_moe(tmp_path_factory):
    """A small real MoE shape with a tokenizer (IBM Granite 3.0 1B-A400M: 32 experts, 8 used)."""
    from kvtuner.testing.gguf_factory import write_real_shape

    return write_real_shape(tmp_path_factory.mktemp("granite") / "granite-moe.gguf", "granite-3.0-1b-a400m", "Q4_0")


@pytest.mark.llama
@pytest.mark.slow
def test_llama_cpp_python_snippet_with_overrides_runs(tmp_path, granite_moe):
    import subprocess
    import sys

    script = tmp_path / "moe.py"
    script.write_text(
        export("llama-cpp-python", granite_moe, PlanConfig(n_ctx=512, n_cpu_moe=2, flash_attn="on")).text,
        encoding="utf-8",
    )
    # the fixture has no tokenizer: load through the snippet's own loader and decode token ids
    child = (
        "import runpy, sys\n"
        "ns = runpy.run_path(sys.argv[1])\n"  # not __main__: defines the loader and kwargs only
        "llm = ns['llama_with_overrides'](ns['KWARGS'], ns['OVERRIDES'])\n"
        "llm.eval([1, 2, 3, 4])\n"
        "print('decoded', llm.n_tokens)\n"
    )
    out = subprocess.run([sys.executable, "-c", child, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("decoded 4")


# ---------------------------------------------------------------- --n-cpu-ffn
@pytest.fixture(scope="module")
def llama8b(tmp_path_factory):
    from kvtuner.testing.gguf_factory import write_real_shape

    return write_real_shape(tmp_path_factory.mktemp("dense") / "llama-3.1-8b.gguf", "llama-3.1-8b", "Q4_K_M")


def test_n_cpu_ffn_moves_the_dense_ffn_of_the_first_layers(llama8b):
    from kvtuner.core.plan.placement import FFN_DENSE_REGEX

    cfg = PlanConfig(n_cpu_ffn=3, flash_attn="on")
    assert tensor_overrides(cfg) == tuple((rf"blk\.{i}" + FFN_DENSE_REGEX, "CPU") for i in range(3))
    table = _table(llama8b)
    plan = plan_memory(ModelProfile.from_gguf(llama8b), cfg, [what_if_gpu(24 * GiB)])
    want = {n: b for n, b in table.items() if re.search(r"^blk\.[0-2]\.ffn_(up|down|gate)\.", n)}
    assert len(want) == 9 and {n: b for n, _, _, b in plan.moves.moved} == want
    assert all(lk.device == "CUDA0" for lk in plan.kv_layers)  # attention and KV stay in VRAM
    assert "--n-cpu-ffn 3" in export("llama-server", llama8b, cfg).text
    kobold = json.loads(export("koboldcpp", llama8b, cfg).text)
    assert kobold["overridetensors"].count("=CPU") == 3


def test_advisor_offers_the_fastest_of_kv_split_ngl_cut_and_n_cpu_ffn(llama8b):
    """Item 7: the KV split, the -ngl cut and the FFN split compete by predicted decode speed; with
    the tuner the fix is the fastest at full context (the tuner's ranking) of those and
    the tuned configuration, and fits."""
    from kvtuner.core.speed.speed_model import decode_tok_s, predict_speed, speed_inputs

    model = ModelProfile.from_gguf(llama8b)
    gpus, host = [what_if_gpu(6 * GiB)], HostSpec(total_bytes=64 * GiB, available_bytes=60 * GiB)
    inputs = speed_inputs(gpus, host, n_threads=4, measure=False)
    limit = 5 * GiB  # 6 GiB less the advisor's 1 GiB margin
    chosen = set()
    for n_ctx in (8192, 32768):
        base = PlanConfig(n_ctx=n_ctx, flash_attn="on", type_k="q8_0", type_v="q8_0", n_ubatch=128)
        plan = plan_memory(model, base, gpus, host)
        (oom,) = [a for a in advise(plan, predict_speed(plan, inputs)) if a.id in ("vram-oom", "vram-tight")]

        def fits(cfg):
            return plan_memory(model, cfg, gpus, host).gpus[0].total_bytes <= limit

        def full(cfg):
            p = plan_memory(model, cfg, gpus, host)
            return decode_tok_s(p, inputs, p.n_ctx_seq - 1)

        kv = [k for k in range(model.n_layer) if fits(base.with_(kv_gpu_layers=k))]
        ngl = [n for n in range(model.n_layer + 1) if fits(base.with_(n_gpu_layers=n))]
        ffn = [n for n in range(model.n_layer + 1) if fits(base.with_(n_cpu_ffn=n))]
        cands = (
            ([{"kv_gpu_layers": max(kv)}] if kv else [])
            + ([{"n_gpu_layers": max(ngl)}] if ngl else [])
            + ([{"n_cpu_ffn": min(ffn)}] if ffn else [])
        )
        assert fits(base.with_(**oom.fix))
        assert full(base.with_(**oom.fix)) >= max(full(base.with_(**fx)) for fx in cands) * (1 - 1e-9)
        chosen.add(next(iter(oom.fix)) if len(oom.fix) == 1 else "tuned")
    assert "n_cpu_ffn" in chosen  # the FFN split wins somewhere
