"""``kvtuner`` command line.

``kvtuner`` with no arguments opens the desktop app; ``kvtuner plan|inspect|bench|tune|export|engines|monitor|library|gpus|probe|install-desktop``
are headless and take ``--json``; ``kvtuner --version`` names the llama.cpp build it plans for. One module per command (:mod:`.plan`, :mod:`.bench`,
:mod:`.export`, :mod:`.gui`); the flags they share come from the configuration catalogue
(:mod:`kvtuner.core.plan.fields`) in :mod:`.args`; text rendering is :mod:`.report`. Every user
mistake ends in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Sequence

from .args import EXIT_USAGE, UserError

__all__ = ["EXIT_USAGE", "UserError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with the usage errors on one line too (``kvtuner plan: error: ...``, exit 2),
    not the whole usage block; ``--help`` still prints it. Subparsers inherit the class.

    A flag means only itself: no abbreviations (``--gpu`` is not ``--gpu-layers``), and a
    single-dash word of several letters is never split into a one-letter flag and its value
    (llama.cpp's flags ``-ngl``, ``-ctk``, ``-cd`` are whole words: ``-cd 4096`` is not
    ``-c d``; common/arg.cpp takes every value as a separate argument)."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list[typing.Any]:
        chars = self.prefix_chars
        if len(option_string) > 2 and option_string[0] in chars and option_string[1] not in chars:
            return []  # an unknown multi-letter single-dash flag: "unrecognized arguments"
        return super()._get_option_tuples(option_string)

    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class _VersionAction(argparse.Action):
    """``--version``: print :func:`kvtuner.about.version_text` as is (argparse's own version
    action re-wraps it into one paragraph) and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: typing.Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: typing.Any,
        option_string: str | None = None,
    ) -> None:
        from ..about import version_text

        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    from . import bench, desktop, engines, export, gui, hardware, monitor, plan, tune

    parser = _Parser(
        prog="kvtuner",
        description="Plan, monitor and tune llama.cpp memory for long contexts on small GPUs.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the version and the llama.cpp build kvtuner plans for, and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (plan, bench, export, gui, hardware, tune, engines, monitor, desktop):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvtuner`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gui", *(argv or [])])
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"kvtuner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvtuner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`kvtuner plan --json | head`): not an error, and no traceback;
        # point stdout at devnull so the interpreter's final flush does not fail again
        # (Python docs, "Note on SIGPIPE")
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
