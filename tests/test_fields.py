"""The configuration catalogue drives every place a field is named: CLI flags, advice labels,
tooltips and exports."""

from __future__ import annotations

import dataclasses

import pytest

from kvtuner.cli import build_parser, main
from kvtuner.core.plan.config import ALL_LAYERS, PlanConfig
from kvtuner.core.plan.fields import FIELDS, cli_flags, config_field


def test_every_config_field_is_in_the_catalogue_once():
    assert [f.name for f in FIELDS] == [f.name for f in dataclasses.fields(PlanConfig)]


@pytest.mark.parametrize("command", ["plan", "bench", "export", "gui"])
def test_every_command_takes_every_configuration_flag(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    options = {s for a in sub._actions for s in a.option_strings}
    for f in FIELDS:
        assert {f.flag, *f.aliases} <= options, (command, f.name)


@pytest.mark.parametrize("command", ["plan", "bench", "export"])
def test_every_headless_command_takes_the_hardware_flags(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    options = {s for a in sub._actions for s in a.option_strings}
    assert {"--gpu-mem", "--no-gpu", "--ram"} <= options


def test_fix_flags_round_trip_through_the_parser():
    changes = {
        "n_ctx": 8192,
        "n_gpu_layers": ALL_LAYERS,
        "type_k": "q8_0",
        "flash_attn": "on",
        "kv_unified": True,
        "use_mmap": False,
    }
    text = cli_flags(changes)
    assert text == "--ctx 8192 --ngl all --cache-type-k q8_0 --flash-attn on --kv-unified --no-mmap"
    args = build_parser().parse_args(["plan", *text.split()])
    from kvtuner.cli.args import config_from_args

    cfg = config_from_args(args)
    assert all(getattr(cfg, k) == v for k, v in changes.items())


def test_tooltips_name_llama_cpp_flags():
    assert config_field("n_ctx").tooltip().startswith("-c / --ctx / --ctx-size:")
    assert "-nkvo" in config_field("kv_gpu_layers").tooltip()


def test_export_takes_gpu_mem_and_warns_when_it_does_not_fit(default_model, capsys):
    assert main(["export", str(default_model), "--format", "llama-server", "--gpu-mem", "12G"]) == 0
    assert "-ngl all" in capsys.readouterr().out
    assert main(["export", str(default_model), "--format", "llama-server", "--gpu-mem", "300M", "-c", "131072"]) == 0
    err = capsys.readouterr().err
    assert "does not fit" in err.lower() and "CUDA0" in err
