"""The tuner searches ``-ub`` where MoE experts live in RAM: with a GPU, a ubatch of 32 or more
rows runs the host experts on the GPU and copies them over PCIe once per ubatch
(``GGML_OP_OFFLOAD_MIN_BATCH``, ggml-cuda.cu ``offload_op``; ggml-backend.cpp
``ggml_backend_sched_compute_splits``), so prefill depends on ``-ub``. gpt-oss-20b's shape on an
8 GB card (the 12 GiB MXFP4 model needs experts in RAM there)."""

from __future__ import annotations

import json

import pytest

from kvtuner.cli import main
from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.speed.speed_model import speed_inputs
from kvtuner.core.tune.search import LONG_PREFILL_TOKENS, UBATCH_CHOICES_HOST_EXPERTS, TuneGoal, tune
from kvtuner.core.units import GiB
from test_moe_offload import gpt_oss, small_moe  # noqa: F401  (fixtures)

#: A 6-core desktop with dual-channel DDR4-3200 (45 GB/s achieved).
HOST = HostSpec(
    total_bytes=64 * GiB,
    available_bytes=60 * GiB,
    what_if=True,
    mem_bandwidth_bytes_s=45e9,
    n_cores=6,
    memory="DDR4-3200x2",
)


def _tune(path, card: str = "RTX 4060", n_ctx: int = 32768):
    gpus = [catalogue_gpu(card)]
    inputs = speed_inputs(gpus, HOST, measure=False)
    return tune(ModelProfile.from_gguf(path), PlanConfig(), gpus, HOST, inputs, TuneGoal(n_ctx=n_ctx))


def test_tuner_searches_large_ubatches_with_experts_in_ram(gpt_oss):  # noqa: F811
    r = _tune(gpt_oss)
    assert r.best is not None and r.best.fits and r.best.plan.host.expert_bytes > 0
    by_ub: dict[int, object] = {}
    for c in r.top:
        if c.plan.host.expert_bytes and c.config.flash_attn == "on":
            by_ub.setdefault(c.config.n_ubatch, c)
    assert set(UBATCH_CHOICES_HOST_EXPERTS) <= set(by_ub), sorted(by_ub)
    for ub in UBATCH_CHOICES_HOST_EXPERTS:
        c = by_ub[ub]
        assert c.fits and c.config.n_batch >= ub  # -b raised with -ub (llama.cpp caps -ub at -b)
    # the same prompt: one 4096-token ubatch copies the host experts once, 512-token ubatches 8 times
    from kvtuner.core.speed.speed_model import prefill_tok_s

    inputs = speed_inputs([catalogue_gpu("RTX 4060")], HOST, measure=False)
    big = prefill_tok_s(by_ub[4096].plan, inputs, LONG_PREFILL_TOKENS)
    small = prefill_tok_s(by_ub[512].plan, inputs, LONG_PREFILL_TOKENS)
    assert big > 2 * small
    # a larger ubatch's compute buffer takes VRAM from the experts: decode pays for it
    assert by_ub[4096].config.n_cpu_moe > by_ub[512].config.n_cpu_moe
    assert by_ub[4096].decode_tok_s < by_ub[512].decode_tok_s
    # the ranking's prefill is a 4096-token prompt, and the trade is said in one note
    assert r.best.prefill_tokens == LONG_PREFILL_TOKENS
    note = next(n for n in r.notes if n.startswith("prefill: -ub "))
    assert "-ub 4096 -b 4096 --n-cpu-moe" in note and "instead of" in note


def test_no_large_ubatch_when_every_expert_fits_the_gpu(small_moe):  # noqa: F811
    r = _tune(small_moe, "RTX 3090", 4096)
    assert r.best is not None and not r.best.plan.host.expert_bytes
    assert all(c.config.n_ubatch <= 512 for c in r.top)
    assert not any(n.startswith("prefill: -ub") for n in r.notes)


@pytest.mark.slow
def test_cli_tune_names_the_ubatch_trade(gpt_oss, capsys):  # noqa: F811
    argv = [
        "tune",
        str(gpt_oss),
        "--gpu",
        "RTX 4060",
        "--host-mem",
        "DDR4-3200x2",
        "--host-cores",
        "6",
        "--ctx",
        "32768",
        "--no-probe",
        "--json",
    ]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["predicted"]["prefill_tokens"] == LONG_PREFILL_TOKENS
    assert any(n.startswith("prefill: -ub 4096") for n in d["notes"])
