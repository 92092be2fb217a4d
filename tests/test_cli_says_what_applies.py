"""The command line says what it planned for and what does not apply, as a user runs it (real
processes, the default model): the text names the card planned for, ``bench`` refuses a card this
machine does not have (as llama-bench's ``-dev`` does), ``tune`` warns past the trained context
as ``plan`` does."""

from __future__ import annotations

import pytest

from kvtuner.core.hardware.nvml import detect_gpus
from kvtuner.testing.cli import run_kvtuner


def test_plan_text_names_the_catalogue_card_and_the_ram():
    out = run_kvtuner("plan", "--gpu", "RTX 3060 12GB", "--ram", "32G", "--no-probe")
    assert out.returncode == 0, out.stderr
    assert "planned for: CUDA0 RTX 3060 12GB (what-if) 12.00 GiB; RAM 32.00 GiB" in out.stdout.splitlines()


def test_plan_text_names_a_generic_card_and_cpu_only():
    out = run_kvtuner("plan", "--gpu-mem", "12G", "--no-probe")
    assert "planned for: CUDA0 what-if 12 GiB GPU 12.00 GiB;" in out.stdout, out.stdout
    out = run_kvtuner("plan", "--no-gpu", "--ram", "16G", "--no-probe")
    assert "planned for: CPU only; RAM 16.00 GiB" in out.stdout.splitlines(), out.stdout


@pytest.mark.skipif(any(g.catalogue == "RTX 3060 12GB" for g in detect_gpus()), reason="this machine has the card")
def test_bench_refuses_a_card_this_machine_does_not_have():
    """One line, exit 2, before anything runs: the bench would measure other hardware."""
    out = run_kvtuner("bench", "--gpu", "RTX 3060 12GB", "-n", "1", "-p", "1", "-r", "1")
    assert out.returncode == 2
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "bench measures this machine" in err and "has no RTX 3060 12GB" in err, err
    assert 'kvtuner plan --gpu "RTX 3060 12GB"' in err


def test_bench_refuses_a_generic_what_if_card():
    out = run_kvtuner("bench", "--gpu-mem", "12G", "-n", "1", "-p", "1", "-r", "1")
    assert out.returncode == 2
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "--gpu-mem 12G is a what-if card" in err, err


@pytest.mark.slow
def test_tune_warns_past_the_trained_context_like_plan():
    """Gemma 3 270M was trained on 32768 tokens: a 65536-token goal gets plan's warning, with
    the context that stays within it."""
    plan = run_kvtuner("plan", "--ctx", "65536", "--gpu", "RTX 3060 12GB", "--no-probe")
    assert "[warning] ctx-exceeds-train: Each sequence gets 65536 tokens of context, more than the 32768" in plan.stdout
    out = run_kvtuner("tune", "--ctx", "65536", "--gpu", "RTX 3060 12GB", "--no-probe")
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("[warning] ctx-exceeds-train:"))
    assert "Each sequence gets 65536 tokens of context, more than the 32768 the model was trained on" in line
    assert "--ctx 32768 stays within it" in line
    within = run_kvtuner("tune", "--ctx", "16384", "--gpu", "RTX 3060 12GB", "--no-probe")
    assert within.returncode == 0 and "ctx-exceeds-train" not in within.stdout
    as_json = run_kvtuner("tune", "--ctx", "65536", "--gpu", "RTX 3060 12GB", "--no-probe", "--json")
    assert as_json.returncode == 0 and "kvtuner: warning: Each sequence gets 65536 tokens" in as_json.stderr
