"""A flag means only itself, on every parser: no abbreviation of a long flag is taken for it
(``--gpu`` is not ``--gpu-layers``), and llama.cpp's multi-letter single-dash flags are never
split into a one-letter flag and its value (``-cd 4096`` is not ``-c d``). Each case ends in one
line on stderr and exit status 2."""

from __future__ import annotations

import argparse

import pytest

from kvtuner.cli import build_parser


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` (itself first) with the words that reach it."""
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, (*path, name))
    return out


def _prefix_cases() -> list[tuple[tuple[str, ...], str, str]]:
    """(words to the parser, long flag, a strict prefix of it that no flag of that parser is)."""
    cases = []
    for path, parser in _parsers(build_parser()):
        flags = {s for a in parser._actions for s in a.option_strings}
        for flag in sorted(flags):
            if not flag.startswith("--") or flag == "--help" or len(flag) < 5:
                continue
            prefix = flag[:-1]
            while prefix in flags and len(prefix) > 3:
                prefix = prefix[:-1]
            if prefix not in flags:
                cases.append((path, flag, prefix))
    return cases


CASES = _prefix_cases()
#: One parser for every case (parsing does not change it).
PARSER = build_parser()
#: Flags a parser requires, with a valid value (so that the abbreviation is what is refused).
REQUIRED = {("export",): ["--format", "llama-server"]}


def test_every_subcommand_is_covered():
    """The walk reaches every subcommand, and each has long flags to abbreviate."""
    commands = {path[0] for path, _flag, _prefix in CASES if path}
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(top.choices) - {"gpus", "install-desktop"} <= commands, set(top.choices) - commands
    assert len(CASES) > 100


PATHS = sorted({path for path, _flag, _prefix in CASES})


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "kvtuner" for p in PATHS])
def test_no_parser_takes_an_abbreviation(path, capsys):
    """Each long flag of the parser, cut short by a letter or more, ends in one line, exit 2."""
    taken = []
    for _path, flag, prefix in (c for c in CASES if c[0] == path):
        try:
            PARSER.parse_args([*path, *REQUIRED.get(path, []), prefix, *(["1"] if path else [])])
            taken.append(f"{prefix} (for {flag})")
            continue
        except SystemExit as exc:
            err = capsys.readouterr().err.strip()
            if exc.code != 2 or len(err.splitlines()) != 1 or prefix not in err:
                taken.append(f"{prefix} (for {flag}): exit {exc.code}, {err!r}")
    assert not taken, taken


def test_the_gui_gpu_flag_is_the_card_not_gpu_layers():
    """``--gpu`` is the what-if card on ``gui`` (``--gpu-layers`` is a flag of its own)."""
    args = build_parser().parse_args(["gui", "--gpu", "RTX 3060 12GB", "--ram", "32G"])
    assert args.gpu_name == ["RTX 3060 12GB"] and args.ram == "32G"
    assert getattr(args, "ngl", None) is None or args.ngl != "RTX 3060 12GB"


def _subparser(command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand."""
    (sub,) = [a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[command]


@pytest.mark.parametrize("command", ["plan", "bench", "tune", "export", "gui"])
def test_a_multi_letter_single_dash_flag_is_never_split(command, capsys):
    """llama-server's ``-cd 4096`` (the draft model's context) is not ``-c d`` here: where the
    command takes a draft model it is the draft's context, elsewhere an unknown flag."""
    argv = [command, *REQUIRED.get((command,), []), "-cd", "4096"]
    takes_draft = any("-cd" in a.option_strings for a in _subparser(command)._actions)
    if takes_draft:
        args = PARSER.parse_args(argv)
        assert args.ctx is None and 4096 in vars(args).values()
    else:
        with pytest.raises(SystemExit) as exc:
            PARSER.parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "-cd" in err, err
    # an unknown multi-letter flag starting with a known one-letter flag is refused everywhere
    with pytest.raises(SystemExit) as exc:
        PARSER.parse_args([command, *REQUIRED.get((command,), []), "-cz", "4096"])
    assert exc.value.code == 2
    assert "-cz" in capsys.readouterr().err
    # the flags it is not are still whole words of their own
    assert PARSER.parse_args([command, *REQUIRED.get((command,), []), "-c", "4096"]).ctx == 4096
