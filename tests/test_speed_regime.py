"""A plan's speed regime (where its weights and KV live) and the likely ranges it brings: with
weights in RAM beside a discrete GPU, and no run of that kind by the model family on this machine,
a range is what about two thirds of the public runs of that regime measured against kvtuner's prediction
(kvtuner.core.speed.regime.REGIME_RANGE_LOG, printed by benchmarks/offload_validation.py).
gpt-oss-20b's shape on a 12 GB card, a what-if desktop host; a dense 8B for the FFN overrides."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from kvtuner.core.hardware.specs import catalogue_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.regime import REGIME_RANGE_LOG, percentile_range, placement_regime, range_note, regime_range
from kvtuner.core.speed.speed_model import predict_speed, speed_inputs
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import write_real_shape
from test_moe_offload import gpt_oss  # noqa: F401  (fixture)
from test_tune_ubatch import HOST  # a 6-core desktop, dual-channel DDR4-3200

CARD = "RTX 3060 12GB"


def _plan(path, gpu: bool = True, **config):
    return plan_memory(
        ModelProfile.from_gguf(path), PlanConfig(n_ctx=4096, **config), [catalogue_gpu(CARD)] if gpu else [], HOST
    )


@pytest.mark.parametrize(
    ("config", "gpu", "regime"),
    [
        ({}, False, "cpu"),
        ({}, True, "full"),
        ({"n_gpu_layers": 12}, True, "partial_ngl"),
        ({"n_gpu_layers": 24}, True, "partial_ngl"),  # -ngl = n_layer: layer 0 stays in RAM
        ({"n_cpu_moe": 6}, True, "experts_cpu"),
        ({"tensor_overrides": ("exps=CPU",)}, True, "experts_cpu"),
        ({"tensor_overrides": ("attn=CPU",)}, True, "partial_ngl"),
        ({"tensor_overrides": ("exps=CUDA0",)}, True, "full"),
        # an experts pattern that also catches the routers and norms (megabytes): experts in RAM
        ({"tensor_overrides": (r"blk\.[0-9]\.ffn_.*=CPU",)}, True, "experts_cpu"),
        ({"kv_gpu_layers": 0}, True, "kv_ram"),
        ({"n_gpu_layers": 12, "n_cpu_moe": 6}, True, "partial_ngl"),
    ],
)
def test_the_regime_is_where_the_plan_keeps_weights_and_kv(gpt_oss, config, gpu, regime):  # noqa: F811
    assert placement_regime(_plan(gpt_oss, gpu, **config)) == regime


def test_dense_weights_sent_to_ram_by_an_override_are_weights_in_ram(tmp_path):
    path = write_real_shape(tmp_path / "llama-3.1-8b.gguf", "llama-3.1-8b")
    assert placement_regime(_plan(path, n_cpu_ffn=16)) == "partial_ngl"
    assert placement_regime(_plan(path, tensor_overrides=("ffn=CPU",))) == "partial_ngl"
    assert placement_regime(_plan(path)) == "full"


def test_an_offload_range_is_what_public_runs_of_its_regime_measured(gpt_oss):  # noqa: F811
    inputs = speed_inputs([catalogue_gpu(CARD)], HOST, measure=False)
    sp = predict_speed(_plan(gpt_oss, n_cpu_moe=12), inputs)
    (dl, dh), (pl, ph) = (regime_range("experts_cpu", p) for p in ("decode", "prefill"))
    assert sp.regime == "experts_cpu" and sp.band_from == sp.prefill_band_from == "public_runs"
    assert sp.band == pytest.approx((sp.decode_tok_s * dl, sp.decode_tok_s * dh))
    assert sp.prefill_band == pytest.approx((sp.prefill_tok_s * pl, sp.prefill_tok_s * ph))
    assert dh < 1.2 and dl < 0.6  # over-predicted more often than under: the range leans low
    # everything on the GPU: the calibration's spread
    full = predict_speed(_plan(gpt_oss), inputs)
    k = math.exp(inputs.sigma_log)
    assert full.regime == "full" and full.band_from == "validation"
    assert full.band == pytest.approx((full.decode_tok_s / k, full.decode_tok_s * k))
    assert range_note("full") is None and range_note("cpu") is None


def test_runs_of_the_family_in_the_regime_replace_the_public_range_phase_by_phase(gpt_oss):  # noqa: F811
    inputs = speed_inputs([catalogue_gpu(CARD)], HOST, measure=False)
    mine = dataclasses.replace(
        inputs,
        sigma_log=0.1,
        prefill_sigma_log=0.1,
        n_calibration_runs=3,
        calibrated_regimes=frozenset({("partial_ngl", "decode")}),
    )
    sp = predict_speed(_plan(gpt_oss, n_gpu_layers=12), mine)
    assert (sp.band_from, sp.prefill_band_from) == ("calibration", "public_runs")
    assert sp.band[1] / sp.decode_tok_s == pytest.approx(math.exp(0.1))
    # runs in another regime do not speak for this one
    assert predict_speed(_plan(gpt_oss, n_cpu_moe=6), mine).band_from == "public_runs"


def test_kv_in_ram_and_unified_memory_have_no_public_range(gpt_oss):  # noqa: F811
    inputs = speed_inputs([catalogue_gpu(CARD)], HOST, measure=False)
    kv = predict_speed(_plan(gpt_oss, kv_gpu_layers=0), inputs)
    assert kv.regime == "kv_ram" and kv.band_from == "validation" and range_note("kv_ram") is None
    apu = catalogue_gpu("Strix Halo 128GB")
    plan = plan_memory(ModelProfile.from_gguf(gpt_oss), PlanConfig(n_ctx=4096, n_gpu_layers=12), [apu], HOST)
    sp = predict_speed(plan, speed_inputs([apu], HOST, measure=False))
    assert sp.regime == "partial_ngl" and sp.band_from == sp.prefill_band_from == "validation"


def test_percentile_range_is_the_central_two_thirds_by_nearest_rank():
    assert percentile_range([0.3, -0.2, 0.1]) == (-0.2, 0.3)  # ranks ceil(0.48) = 1 and ceil(2.52) = 3
    assert percentile_range([0.01 * i for i in range(1, 11)]) == pytest.approx((0.02, 0.09))  # 2nd, 9th of 10
    assert percentile_range([-0.5]) == (-0.5, -0.5)
    with pytest.raises(ValueError):
        percentile_range([])


def test_plan_names_the_regime_and_its_ranges(gpt_oss):  # noqa: F811
    host = ["--gpu", CARD, "--host-mem", "DDR4-3200x2", "--host-cores", "6", "--pcie", "4x16", "--no-probe"]
    cp = run_kvtuner("plan", str(gpt_oss), *host, "--n-cpu-moe", "12")
    assert cp.returncode == 0, cp.stderr
    (dl, dh), (pl, ph) = (regime_range("experts_cpu", p) for p in ("decode", "prefill"))
    line = (
        f"likely ranges: about two thirds of the public runs with MoE experts in RAM measured {dl:.2f}-{dh:.2f}x "
        f"kvtuner's decode prediction and {pl:.2f}-{ph:.2f}x kvtuner's prefill prediction"
    )
    assert line in cp.stdout
    prefill = next(x for x in cp.stdout.splitlines() if x.strip().startswith("prefill"))
    assert "(likely " in prefill
    js = run_kvtuner("plan", str(gpt_oss), *host, "-ngl", "12", "--json")
    assert js.returncode == 0, js.stderr
    speed = json.loads(js.stdout)["speed"]
    assert speed["regime"] == "partial_ngl" and speed["band_from"] == "public_runs"
    ratio = speed["prefill_band"][1] / speed["prefill_tok_s"]
    assert ratio == pytest.approx(math.exp(REGIME_RANGE_LOG["partial_ngl"]["prefill"][1]))


def test_the_window_shows_both_ranges_and_says_where_they_come_from(qtbot, gpt_oss):  # noqa: F811
    from kvtuner.gui.widgets.prediction_panel import PredictionPanel

    inputs = speed_inputs([catalogue_gpu(CARD)], HOST, measure=False)
    plan = _plan(gpt_oss, n_cpu_moe=12)
    sp = predict_speed(plan, inputs)
    panel = PredictionPanel()
    qtbot.addWidget(panel)
    panel.set_plan(plan, sp)
    text = panel.speed_label.text()
    assert text.count("(likely ") == 2 and "tok/s with the context full" in text
    assert panel.speed_label.toolTip() == range_note("experts_cpu")
    panel.set_plan(_plan(gpt_oss), predict_speed(_plan(gpt_oss), inputs))
    assert "docs/accuracy/speed.md" in panel.speed_label.toolTip()
