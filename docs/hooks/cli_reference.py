"""MkDocs hook: pages generated from the code at every build, so they cannot drift from it.

- ``reference/cli.md``: the marker ``<!-- kvtuner-cli-reference -->`` is replaced by every
  ``kvtuner`` subcommand and flag, read from the argparse parsers that ``kvtuner`` itself runs
  (:func:`kvtuner.cli.build_parser`): usage line, description, then one table per argument group
  (flags, argument, choices, default, help text).
- ``accuracy/results/<name>.md``: one page per dated measurement record under
  ``benchmarks/results/`` and ``benchmarks/gpu_truth/results/`` (the Markdown files only; the JSON
  beside them stays in the repository), so the Accuracy pages can link to them.

Building the parsers imports kvtuner's core (the ``gguf`` package among its dependencies), not
Qt and not llama_cpp. ``tests/test_cli_reference.py`` renders the same Markdown and fails when a
flag has no help text.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- kvtuner-cli-reference -->"
CLI_PAGE = "reference/cli.md"
RESULT_DIRS = ("benchmarks/results", "benchmarks/gpu_truth/results")
RESULT_PAGES = "accuracy/results"


def _parser() -> argparse.ArgumentParser:
    # the usage lines wrap at the terminal width: fix it so that every build writes the same page
    os.environ["COLUMNS"] = "100"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from kvtuner.cli import build_parser

    return build_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """``{name: (one-line help, parser)}`` of every subcommand, in registration order."""
    out: dict[str, tuple[str, argparse.ArgumentParser]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out[name] = (helps.get(name, ""), sub)
    return out


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's arguments a user gives: every action except ``--help`` and the subcommands."""
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's help as ``--help`` prints it (``%(default)s`` expanded); "" when it has none
    or is hidden (``argparse.SUPPRESS``)."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action).strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _argument(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
        return _code(metavar.replace("\n", " "))  # a pipe inside a code span does not split the cell
    return _code(action.dest.upper())


def _default(action: argparse.Action) -> str:
    d = action.default
    if d is None or d is False or d == argparse.SUPPRESS or action.nargs == 0 or d == []:
        return ""
    return _code(_cell(str(d)))


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage block without its ``usage: `` prefix, continuation lines shifted to match."""
    prefix = "usage: "
    lines = parser.format_usage().strip().splitlines()
    return "\n".join(
        line[len(prefix) :] if line.startswith(prefix) or not line[: len(prefix)].strip() else line for line in lines
    )


def render_parser(name: str, summary: str, parser: argparse.ArgumentParser) -> str:
    """One subcommand as Markdown: heading, summary, usage, description, a table per group."""
    usage = _usage(parser)
    lines = [f"## `{name}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    lines += ["```text", usage, "```", ""]
    if parser.description:
        lines += [parser.description.strip(), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a in documented_actions(parser)]
        if not actions:
            continue
        title = group.title or ""
        lines += [f"**{title[0].upper() + title[1:]}**" if title else "", ""]
        lines += ["| argument | value | default | meaning |", "|---|---|---|---|"]
        for a in actions:
            flags = ", ".join(f"`{s}`" for s in a.option_strings) or _code(str(a.metavar or a.dest))
            lines.append(
                f"| {flags} | {_argument(a) if a.option_strings else ''} | {_default(a)} "
                f"| {_cell(help_text(parser, a))} |"
            )
        lines.append("")
    return "\n".join(lines)


def render_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every ``kvtuner`` command and flag as Markdown (the body of ``reference/cli.md``)."""
    parser = parser or _parser()
    subs = subcommands(parser)
    lines = ["```text", _usage(parser), "```", ""]
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{n}`](#{n}) | {_cell(h)} |" for n, (h, _) in subs.items()]
    lines.append("")
    for a in documented_actions(parser):
        lines.append(f"`{', '.join(a.option_strings)}`: {help_text(parser, a)}.")
    lines.append("")
    for n, (h, sub) in subs.items():
        lines.append(render_parser(n, h, sub).replace(f"## `{n}`", f"## `{n}` {{#{n}}}", 1))
    return "\n".join(lines)


def on_files(files, config):  # MkDocs hook signature
    """Add one page per dated measurement record (``benchmarks/results/*.md`` and the GPU run's)."""
    from mkdocs.structure.files import File

    for folder in RESULT_DIRS:
        for path in sorted((ROOT / folder).glob("*.md")):
            if path.name == "README.md":
                continue
            files.append(File.generated(config, f"{RESULT_PAGES}/{path.name}", abs_src_path=str(path)))
    return files


def missing_help(parser: argparse.ArgumentParser) -> list[str]:
    """``"kvtuner plan --flag"`` for every argument of every subcommand without help text."""
    out = [f"kvtuner {', '.join(a.option_strings)}" for a in documented_actions(parser) if not help_text(parser, a)]
    for name, (_, sub) in subcommands(parser).items():
        out += [
            f"kvtuner {name} {', '.join(a.option_strings) or a.dest}"
            for a in documented_actions(sub)
            if not help_text(sub, a)
        ]
    return out


def on_page_markdown(markdown: str, page, config, files) -> str:  # MkDocs hook signature
    """Fill the CLI reference page from the parsers; a flag without help text fails the build."""
    if page.file.src_uri == CLI_PAGE:
        if MARKER not in markdown:
            raise ValueError(f"{CLI_PAGE} lost its marker {MARKER}")
        parser = _parser()
        missing = missing_help(parser)
        if missing:
            raise ValueError("arguments without help text (add help= to each): " + "; ".join(missing))
        return markdown.replace(MARKER, render_reference(parser))
    return markdown
