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
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from layerscope import __version__
from layerscope.cli import _demo, _diff, _export, _plot, _report, _runs, _serve, _summary
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


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand in ``COMMANDS``, each with ``--plain``."""
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
        subparser.set_defaults(handler=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``layerscope`` command with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0; 2 for a path that holds no run or a usage error, 1 where an
        optional package is missing (each with one line on stderr); 130 if interrupted.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
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
