"""``layerscope report RUN -o FILE.html``: one HTML file with the dashboard's views, offline."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING

from layerscope.cli._arguments import RUN_METAVAR, new_file
from layerscope.cli._open import CommandError, open_run
from layerscope.cli._progress import progress
from layerscope.cli._storage_options import storage_options
from layerscope.cli._visible import visible

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``report``'s parser."""
    parser = subparsers.add_parser(
        "report",
        help="a self-contained HTML report of a run",
        description="Write one HTML file with the dashboard's views of RUN (scalars, heat "
        "maps, each layer's series and histograms, alerts, modules, overhead) and their data, "
        "with interactive charts; it opens in a browser without a network. "
        "Needs: pip install 'layerscope[ui]'.",
    )
    parser.add_argument("path", metavar=RUN_METAVAR, help="the run's directory")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=new_file,
        metavar="FILE",
        help="the HTML file to write",
    )
    parser.add_argument(
        "--compare", metavar="OTHER", help="another run of the same model, shown beside it"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Write the report and say where it is."""
    from layerscope.ui import report_html  # plotly: the ui extra, imported now

    options = storage_options(args)
    run_ = open_run(args.path, options)
    other = None if args.compare is None else open_run(args.compare, options)
    with progress("making the report's charts") as advance:
        encoded = report_html(run_, compare=other, answered=advance).encode("utf-8")
    _write(args.output, encoded)
    print(f"wrote {visible(args.output)} ({len(encoded) / 1e6:.1f} MB)", file=sys.stderr)
    return 0


def _write(path: str, content: bytes) -> None:
    """``content`` into the file at ``path``; a CommandError naming ``-o`` if it cannot be.

    The folder was checked when the arguments were read, but a write can still fail: a link
    into a folder that is gone, a full disk. A file cut short is removed, not left as a report.
    """
    opened = False
    try:
        with open(path, "wb") as file:
            opened = True
            file.write(content)
    except OSError as error:
        if opened and os.path.isfile(path):
            with contextlib.suppress(OSError):
                os.remove(path)
        reason = error.strerror or str(error)
        raise CommandError(f"-o: cannot write {path}: {reason}") from None
