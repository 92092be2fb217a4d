"""The architecture registry (kvtuner/core/model/arch): one record per architecture, one table.

- A family defined in one place (here: a copy of ``llama`` under a new architecture name,
  registered from the test) is planned, graphed and priced without touching any other file: its
  sparse GGUF gets an analytic structure, a reserve graph rebuilt node by node and the same
  memory plan, compute buffer and speed prediction as the same model written as ``llama``.
- Every registered architecture is defined in a module whose docstring names it; the families
  the documents list (the compute-buffer docstring, docs/development/adding-an-architecture.md)
  are the registry's.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu
from kvtuner.core.model import arch
from kvtuner.core.model.arch import REGISTRY, Family, GraphRules, families_markdown, family_of, register
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan import compute_buffer
from kvtuner.core.plan.compute_buffer import ComputeRequest, estimate_compute
from kvtuner.core.plan.config import ConfigError, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.reserve_graph import last_layer_rows_only, transformer_shape
from kvtuner.core.speed.speed_model import fallback_cpu_rates, predict_speed, speed_inputs
from kvtuner.testing.gguf_factory import ModelSpec, write_model

ROOT = Path(__file__).resolve().parents[1]

#: the test-only family: llama's rules under another architecture name
TEST_ARCH = "kvtuner-test-llama"
TEST_FAMILY = Family(TEST_ARCH, "test copy of llama", tested=True, graph=GraphRules(moe_norm_w=True))

#: CPU rates without a probe, the same for every prediction here (the comparison needs equal inputs)
RATES = fallback_cpu_rates(2, 20e9)


@pytest.fixture
def test_family():
    assert TEST_ARCH not in REGISTRY
    register(TEST_FAMILY)
    yield TEST_FAMILY
    del REGISTRY[TEST_ARCH]


def _figures(model: ModelProfile, config: PlanConfig, gpus=()):
    host = HostSpec(32 << 30, 24 << 30, mem_bandwidth_bytes_s=20e9)
    plan = plan_memory(model, config, list(gpus), host)
    speed = predict_speed(plan, speed_inputs(list(gpus), host, n_threads=2, cpu=RATES), prefill_tokens=256)
    d = plan.to_dict()
    d.pop("model", None)
    return plan, d, (speed.decode_tok_s, speed.prefill_tok_s, speed.decode_tok_s_at_full_ctx)


def test_a_family_registered_from_one_place_is_planned_graphed_and_priced(tmp_path, test_family):
    spec = ModelSpec(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=2048)
    ours = ModelProfile.from_gguf(write_model(tmp_path / "test.gguf", dataclasses.replace(spec, arch=TEST_ARCH)))
    llama = ModelProfile.from_gguf(write_model(tmp_path / "llama.gguf", spec))
    assert ours.architecture == TEST_ARCH and family_of(TEST_ARCH) is test_family
    # planned: the family's structure rules, checked (tested=True), so analytic
    assert (ours.structure.source, ours.structure.memory) == ("analytic", "kv")
    assert ours.structure.layers == llama.structure.layers
    for config in (
        PlanConfig(n_ctx=4096, flash_attn="on"),
        PlanConfig(n_ctx=2048, flash_attn="off", type_k="q8_0", n_seq=2),
    ):
        plan, ours_plan, ours_speed = _figures(ours, config)
        # graphed: the reserve graph is rebuilt node by node (not the phase estimate)
        shape = transformer_shape(ours, plan.kv_layers, config.type_k, config.type_v)
        assert shape is not None and len(shape.layers) == 4
        assert plan.compute.bytes_on("CPU") > 0
        # and every figure, the compute buffer and the speed prediction included, is llama's
        _, llama_plan, llama_speed = _figures(llama, config)
        assert ours_plan == llama_plan
        assert ours_speed == llama_speed and ours_speed[0] > 0
    # priced on a GPU too (the phase estimate of the compute buffer, the GPU speed model)
    gpu = catalogue_gpu("RTX 3060 12GB")
    plan, ours_plan, ours_speed = _figures(ours, PlanConfig(n_ctx=8192, flash_attn="on"), [gpu])
    _, llama_plan, llama_speed = _figures(llama, PlanConfig(n_ctx=8192, flash_attn="on"), [gpu])
    assert ours_plan == llama_plan and ours_speed == llama_speed
    assert plan.compute.bytes_on("CUDA0") > 0 and ours_speed[0] > 0


def test_without_its_family_the_architecture_is_approximate_and_not_rebuilt(tmp_path):
    """The same file without the registration: the generic family, figures labelled approximate,
    the phase estimate instead of the rebuilt graph."""
    assert TEST_ARCH not in REGISTRY
    model = ModelProfile.from_gguf(write_model(tmp_path / "t.gguf", ModelSpec(arch=TEST_ARCH)))
    assert model.structure.source == "approximate" and TEST_ARCH in model.structure.note
    plan = plan_memory(model, PlanConfig(n_ctx=1024, flash_attn="on"))
    assert transformer_shape(model, plan.kv_layers) is None


def test_family_traits_reach_the_speed_model(test_family):
    """``last_layer_rows_only`` (read by the speed model and the CPU probe) follows the family's
    graph traits: gpt-oss and Gemma 4 take the output rows after the layers / the norm."""
    assert last_layer_rows_only("llama") and last_layer_rows_only(TEST_ARCH)
    assert not last_layer_rows_only("gpt-oss") and not last_layer_rows_only("gemma4")
    REGISTRY[TEST_ARCH] = dataclasses.replace(test_family, graph=GraphRules(traits={"rows_after_layers": True}))
    assert not last_layer_rows_only(TEST_ARCH)


def test_estimate_compute_takes_a_record_or_its_fields(tmp_path):
    model = ModelProfile.from_gguf(write_model(tmp_path / "m.gguf", ModelSpec()))
    plan = plan_memory(model, PlanConfig(n_ctx=2048, flash_attn="on"))
    fields = dict(
        n_ubatch=512,
        n_seq=1,
        n_ctx_seq=2048,
        swa_cells=0,
        flash_attn=True,
        layer_devices=["CUDA0"] * (model.n_layer + 1),
        kv_layers=plan.kv_layers,
        gpu_devices=["CUDA0"],
        host="CPU",
    )
    by_record = estimate_compute(model, ComputeRequest(**fields))
    assert by_record == estimate_compute(model, **fields)
    assert by_record.bytes_on("CUDA0") > 0
    with pytest.raises(TypeError):
        estimate_compute(model, ComputeRequest(**fields), n_ubatch=256)


def test_a_family_flag_reaches_the_context_checks(tmp_path):
    """deepseek4 takes one K and V cache type (llama-context.cpp ``llama_init_from_model``), by its
    family's ``same_kv_types``; llama does not."""
    config = PlanConfig(n_ctx=1024, flash_attn="off", type_k="q8_0", type_v="f16")
    deepseek4 = ModelProfile.from_gguf(write_model(tmp_path / "d.gguf", ModelSpec(arch="deepseek4")))
    with pytest.raises(ConfigError, match="same K and V cache type"):
        plan_memory(deepseek4, config)
    llama = ModelProfile.from_gguf(write_model(tmp_path / "l.gguf", ModelSpec()))
    assert plan_memory(llama, config).kv_caches


def _defining_modules():
    return {fam.arch: module for module in arch.MODULES for fam in module.FAMILIES}


def test_every_architecture_has_a_module_that_documents_it():
    modules = _defining_modules()
    assert set(modules) == set(REGISTRY)
    assert len(REGISTRY) >= 50
    for a, module in modules.items():
        doc = module.__doc__ or ""
        assert f"``{a}``" in doc, f"{module.__name__}'s docstring does not name {a}"
        assert "src/models/" in doc or "create_memory" in doc or "llama-arch.cpp" in doc, module.__name__


def test_the_documents_list_the_registry():
    """The compute-buffer docstring names every family whose graph is rebuilt, and nothing else;
    docs/development/adding-an-architecture.md holds the registry's table."""
    rebuilt = {a for a, fam in REGISTRY.items() if fam.graph is not None}
    doc = compute_buffer.__doc__ or ""
    para = doc[doc.index("On the CPU alone") : doc.index("the figure is computed")]
    assert set(re.findall(r"``([^`]+)``", para)) == rebuilt
    page = (ROOT / "docs/development/adding-an-architecture.md").read_text()
    table = page.split("<!-- families: generated by kvtuner.core.model.arch.families_markdown -->\n")[1]
    assert table.split("<!-- /families -->")[0] == families_markdown()


#: the modules of the registry and of the code that reads it: no function longer than this
MAX_FUNCTION_LINES = 120
REGISTRY_FILES = (
    "kvtuner/core/model/hparams.py",
    "kvtuner/core/model/meta.py",
    "kvtuner/core/plan/reserve_graph.py",
    "kvtuner/core/plan/compute_buffer.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kvtuner/core/model/arch").glob("*.py")),
)


def test_no_function_of_the_registry_and_its_readers_is_over_120_lines():
    lengths = []
    for rel in REGISTRY_FILES:
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
    lengths.sort(reverse=True)
    print("longest:", lengths[:5])
    assert lengths[0][0] <= MAX_FUNCTION_LINES, lengths[:5]
