"""The ``layerscope`` command: ``demo``, ``summary RUN``, ``diff``, ``runs``, ``plot``, ``export``.

Each subcommand is a module with ``add_parser(subparsers)``, which adds its parser and
returns it, and ``run(args)``, which does the work and returns the exit status: adding a
subcommand is adding its module to ``COMMANDS``. Commands read runs through
``layerscope.load`` and ``layerscope.runs`` only, and import rich and pandas when they run,
never when ``layerscope`` is imported.

Example::

    layerscope summary runs/exp1
    layerscope diff runs/exp1 runs/exp2 --plain
    layerscope runs runs
    layerscope summary s3://bucket/runs/exp1 --storage-option anon=true
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from layerscope import __version__
from layerscope.cli import (
    _demo,
    _diff,
    _export,
    _plot,
    _report,
    _runs,
    _serve,
    _storage_options,
    _summary,
)
from layerscope.cli._command import Subcommand
from layerscope.cli._open import CommandError
from layerscope.cli._visible import visible

# Exit statuses besides 0: a run that cannot be read, as argparse's usage errors; a missing
# optional package; an interrupt, as a shell reports SIGINT.
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

COMMANDS: tuple[Subcommand, ...] = (_demo, _summary, _diff, _runs, _plot, _serve, _report, _export)
# Commands that print no tables: ``--plain`` would change nothing.
_NO_TABLES: tuple[Subcommand, ...] = (_serve,)
# Commands that read no run through ``load`` or ``runs``: ``demo`` writes its own on this
# machine, ``serve`` takes a local folder only (its dashboard takes no storage options).
_NO_STORAGE: tuple[Subcommand, ...] = (_demo, _serve)
# Options a command takes before its name too (``layerscope --plain summary RUN``): ``main``
# moves them after it, where the command's parser reads them. Each with how many values follow.
_GLOBAL_OPTIONS = {"--plain": 0, _storage_options.OPTION: 1}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand in ``COMMANDS``, with ``--plain`` and ``--storage-option``.

    Each subcommand's parser is its namespace's ``parser``: one that is given an argument it
    does not know says so with its own usage, not the top level's.
    """
    parser = argparse.ArgumentParser(
        prog="layerscope",
        description="Read the runs that layerscope.watch(model, run=...) wrote.",
    )
    parser.add_argument("--version", action="version", version=f"layerscope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        subparser = command.add_parser(subparsers)
        if command not in _NO_TABLES:
            subparser.add_argument(
                "--plain",
                action="store_true",
                help="plain aligned text, also on a terminal (the default where output is not one)",
            )
        if command not in _NO_STORAGE:
            _storage_options.add_argument(subparser)
        subparser.set_defaults(handler=command.run, parser=subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``layerscope`` command with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0; 2 for a path that holds no run or a usage error, 1 where an
        optional package is missing (each with one line on stderr); 130 if interrupted.
    """
    parser = build_parser()
    argv = _globals_after_command(list(sys.argv[1:] if argv is None else argv))
    unknown = _unknown_command(parser, argv)
    if unknown is not None:
        print(unknown, file=sys.stderr)
        return EXIT_USAGE
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            args.parser.error(_unrecognized(args.parser, extra))
    except SystemExit as exit_:  # --help, --version, or a usage error argparse printed
        if exit_.code is None:
            return 0
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warn_in_one_line
            status: int = args.handler(args)
            sys.stdout.flush()  # a closed pipe shows here, inside the try
        return status
    except CommandError as error:  # its message may quote a run's names or files
        print(f"layerscope {args.command}: {visible(str(error))}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as error:  # a missing extra: the message says what to install
        print(f"layerscope {args.command}: {visible(str(error))}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        # `layerscope runs | head`: the reader has gone. Point stdout at nothing so that
        # Python's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _command_names(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:  # argparse keeps its subparsers among its actions
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _first_word(argv: list[str]) -> str | None:
    """The first argument that is not an option: the command."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _globals_after_command(argv: list[str]) -> list[str]:
    """``layerscope --plain summary RUN`` as ``layerscope summary --plain RUN``.

    So with each of ``_GLOBAL_OPTIONS`` before the command, and its value
    (``--storage-option anon=true``, not a command named ``anon=true``).
    """
    before: list[str] = []
    moved: list[str] = []
    at = 0
    while at < len(argv) and argv[at].startswith("-") and argv[at] != "--":
        name, equals, _ = argv[at].partition("=")
        values = _GLOBAL_OPTIONS.get(name)
        if values is None:
            before.append(argv[at])  # --version, --help: the top level's own
            at += 1
            continue
        taken = 1 + (0 if equals else values)
        moved += argv[at : at + taken]
        at += taken
    if not moved or at >= len(argv) or argv[at] == "--":  # no command: argparse says so
        return argv
    return [*before, argv[at], *moved, *argv[at + 1 :]]


def _unknown_command(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The line for a command that does not exist, with the nearest one; None if it exists."""
    command = _first_word(argv)
    names = _command_names(parser)
    if command is None or command in names:
        return None
    near = difflib.get_close_matches(command, names, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (
        f"layerscope: unknown command {visible(command)!r}{hint} "
        f"(the commands: {', '.join(names)}; layerscope --help says more)"
    )


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """The "unrecognized arguments" line, with the nearest option to an unknown one."""
    message = f"unrecognized arguments: {' '.join(extra)}"
    options = [name for action in parser._actions for name in action.option_strings]
    flags = [arg.partition("=")[0] for arg in extra if arg.startswith("--")]
    near = [match for flag in flags for match in difflib.get_close_matches(flag, options, n=1)]
    return f"{message}; did you mean {near[0]}?" if near else message


def _warn_in_one_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Show a warning (a damaged file skipped, say) as one line, without the source line."""
    print(f"warning: {visible(str(message))}", file=sys.stderr)
