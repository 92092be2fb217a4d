"""A plan's speed regime (where its weights and KV live) and the prediction bands it brings: in an
offload regime a band is at least the spread of kvtuner's errors on public measurements of that
regime (kvtuner.core.speed.regime.REGIME_BAND_LOG, printed by benchmarks/offload_validation.py).
gpt-oss-20b's shape on a 12 GB card, a what-if desktop host."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from kvtuner.core.hardware.specs import catalogue_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.regime import REGIME_BAND_LOG, band_log, band_note, placement_regime
from kvtuner.core.speed.speed_model import predict_speed, speed_inputs
from kvtuner.testing.cli import run_kvtuner
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
        ({"n_gpu_layers": 24}, True, "partial_ngl"),  # the output layer stays in RAM
        ({"n_cpu_moe": 6}, True, "experts_cpu"),
        ({"tensor_overrides": ("exps=CPU",)}, True, "experts_cpu"),
        ({"kv_gpu_layers": 0}, True, "kv_ram"),
        ({"n_gpu_layers": 12, "n_cpu_moe": 6}, True, "partial_ngl"),
    ],
)
def test_the_regime_is_where_the_plan_keeps_weights_and_kv(gpt_oss, config, gpu, regime):  # noqa: F811
    assert placement_regime(_plan(gpt_oss, gpu, **config)) == regime


def test_an_offload_band_is_at_least_the_regimes_measured_spread(gpt_oss):  # noqa: F811
    inputs = speed_inputs([catalogue_gpu(CARD)], HOST, measure=False)
    assert inputs.sigma_log < REGIME_BAND_LOG["experts_cpu"][0]
    sp = predict_speed(_plan(gpt_oss, n_cpu_moe=12), inputs)
    d, p = REGIME_BAND_LOG["experts_cpu"]
    assert sp.regime == "experts_cpu"
    assert sp.band == pytest.approx((sp.decode_tok_s / math.exp(d), sp.decode_tok_s * math.exp(d)))
    assert sp.prefill_band == pytest.approx((sp.prefill_tok_s / math.exp(p), sp.prefill_tok_s * math.exp(p)))
    # everything on the GPU: the calibration's spread, unwidened
    full = predict_speed(_plan(gpt_oss), inputs)
    k = math.exp(inputs.sigma_log)
    assert full.regime == "full" and full.band == pytest.approx((full.decode_tok_s / k, full.decode_tok_s * k))
    assert band_note("full") is None


def test_a_wider_calibration_spread_is_kept(gpt_oss):  # noqa: F811
    inputs = speed_inputs([catalogue_gpu(CARD)], HOST, measure=False)
    wide = dataclasses.replace(inputs, sigma_log=1.0, prefill_sigma_log=1.0)
    sp = predict_speed(_plan(gpt_oss, n_gpu_layers=12), wide)
    assert sp.band[1] / sp.decode_tok_s == pytest.approx(math.e)
    assert sp.prefill_band[1] / sp.prefill_tok_s == pytest.approx(math.e)


def test_band_log_is_the_error_two_of_three_rows_stay_within():
    assert band_log([0.1, -0.2, 0.3]) == 0.3  # ceil(0.6827 * 3) = 3rd smallest |error|
    assert band_log([0.01 * i for i in range(1, 11)]) == pytest.approx(0.07)  # 7th of 10
    assert band_log([-0.5]) == 0.5
    with pytest.raises(ValueError):
        band_log([])


def test_plan_names_the_regime_and_its_bands(gpt_oss):  # noqa: F811
    host = ["--gpu", CARD, "--host-mem", "DDR4-3200x2", "--host-cores", "6", "--pcie", "4x16", "--no-probe"]
    cp = run_kvtuner("plan", str(gpt_oss), *host, "--n-cpu-moe", "12")
    assert cp.returncode == 0, cp.stderr
    d, p = (math.exp(x) for x in REGIME_BAND_LOG["experts_cpu"])
    line = f"bands: two of three public measurements with MoE experts in RAM were within x{d:.2f} (decode) and x{p:.2f}"
    assert line in cp.stdout
    prefill = next(x for x in cp.stdout.splitlines() if x.strip().startswith("prefill"))
    assert "(band " in prefill
    js = run_kvtuner("plan", str(gpt_oss), *host, "-ngl", "12", "--json")
    assert js.returncode == 0, js.stderr
    speed = json.loads(js.stdout)["speed"]
    assert speed["regime"] == "partial_ngl"
    ratio = speed["prefill_band"][1] / speed["prefill_tok_s"]
    assert ratio == pytest.approx(math.exp(REGIME_BAND_LOG["partial_ngl"][1]))
