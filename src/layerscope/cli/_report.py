"""``layerscope report RUN -o FILE.html``: one HTML file with the dashboard's views, offline."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from layerscope.cli._arguments import RUN_METAVAR, new_file
from layerscope.cli._open import open_run

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

    run_ = open_run(args.path)
    other = None if args.compare is None else open_run(args.compare)
    html = report_html(run_, compare=other)
    with open(args.output, "w", encoding="utf-8") as file:
        file.write(html)
    size = len(html.encode("utf-8"))
    print(f"wrote {args.output} ({size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
