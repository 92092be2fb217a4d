"""The CLI reference of the documentation (docs/reference/cli.md) is generated from the argparse
parsers by the MkDocs hook docs/hooks/cli_reference.py. Every flag of every subcommand must say
what it does: a flag without help text would be a blank row there and a bare name in --help."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from kvtuner.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _hook():
    spec = importlib.util.spec_from_file_location("cli_reference_hook", ROOT / "docs" / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()
PARSER = build_parser()
SUBCOMMANDS = HOOK.subcommands(PARSER)


def test_every_subcommand_is_registered_with_a_summary():
    """The reference lists the commands kvtuner's own parser has, each with its one-line help."""
    assert {"plan", "inspect", "bench", "export", "library", "gui", "gpus", "probe", "tune", "install-desktop"} <= set(
        SUBCOMMANDS
    )
    assert not [name for name, (summary, _) in SUBCOMMANDS.items() if not summary.strip()]


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_flag_has_help_text(name):
    """No argument of any subcommand lacks help text or hides it with argparse.SUPPRESS."""
    _, parser = SUBCOMMANDS[name]
    missing = [a.option_strings or [a.dest] for a in HOOK.documented_actions(parser) if not HOOK.help_text(parser, a)]
    assert not missing, f"kvtuner {name}: arguments without help text: {missing}"


def test_top_level_flags_have_help_text():
    assert all(HOOK.help_text(PARSER, a) for a in HOOK.documented_actions(PARSER))


def test_reference_names_every_flag_with_its_help():
    """The generated Markdown has a section per command and a row per flag, with the help text
    --help prints (``%(default)s`` expanded)."""
    page = HOOK.render_reference(PARSER)
    for name, (_, parser) in SUBCOMMANDS.items():
        assert f"## `{name}` {{#{name}}}" in page
        for action in HOOK.documented_actions(parser):
            for flag in action.option_strings:
                assert f"`{flag}`" in page, (name, flag)
            assert HOOK.help_text(parser, action).replace("|", "\\|") in page, (name, action.dest)
    assert "| `--ctx`, `-c`, `--ctx-size` | `N` |" in page


def test_reference_page_and_hook_are_wired_into_mkdocs():
    """mkdocs.yml runs the hook and the page keeps the marker the hook replaces."""
    assert "docs/hooks/cli_reference.py" in (ROOT / "mkdocs.yml").read_text()
    assert HOOK.MARKER in (ROOT / "docs" / HOOK.CLI_PAGE).read_text()


def test_a_flag_without_help_fails_the_check():
    """The check itself: an argument added without help is reported, a hidden one too."""
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--fine", help="does a thing")
    parser.add_argument("--bare")
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    missing = [a.option_strings for a in HOOK.documented_actions(parser) if not HOOK.help_text(parser, a)]
    assert missing == [["--bare"], ["--hidden"]]


def test_the_docs_build_refuses_a_flag_without_help():
    """The hook's own check (it fails `mkdocs build`): nothing missing in kvtuner's parsers, and a
    subcommand flag without help is named with its command."""
    assert HOOK.missing_help(PARSER) == []
    parser = argparse.ArgumentParser(prog="kvtuner")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="a demo").add_argument("--bare")
    assert HOOK.missing_help(parser) == ["kvtuner demo --bare"]


def test_every_advice_id_is_in_the_advice_reference():
    """docs/reference/advice.md lists every rule id the advisor can emit (the ids its module
    docstring names, plus the workload rules)."""
    import re

    from kvtuner.core.advice import advisor, backends, workload

    ids = set(re.findall(r"``([a-z0-9]+(?:-[a-z0-9]+)+)``", advisor.__doc__.split("Rule ids")[1].split(".\n")[0]))
    ids |= set(re.findall(r"``(workload-[a-z-]+)``", workload.__doc__))
    ids |= set(re.findall(r"^- ``([a-z0-9]+(?:-[a-z0-9]+)+)``", backends.__doc__, re.M))
    assert {"vulkan-allocation-limit", "unified-memory-pool"} <= ids
    assert len(ids) >= 17, ids
    page = (ROOT / "docs" / "reference" / "advice.md").read_text()
    assert not [i for i in sorted(ids) if f"`{i}`" not in page]
