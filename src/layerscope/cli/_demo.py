"""``layerscope demo``: a training run going wrong, the alerts that say where, and the fix.

Trains the small CNN of ``_demo_training`` on scikit-learn's digits twice, broken and fixed,
each watched into a run under ``--out``; prints what the broken run's alerts and layers say
and both runs' accuracy, writes the standard figures of each run and an HTML report of both,
and with ``--serve`` serves the dashboard over them.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope.cli._alerts import alerts_table, count_line, severity_counts
from layerscope.cli._console import Output, open_output
from layerscope.cli._open import CommandError, open_run

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers
    from layerscope.cli._demo_training import Result

# Marks a folder the demo made, so that a second demo may replace what the first wrote.
MARKER = ".layerscope-demo"
ALERTS_SHOWN = 8


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``demo``'s parser."""
    parser = subparsers.add_parser(
        "demo",
        help="watch a small CNN learn digits: broken, then fixed",
        description=(
            "Train a small CNN on scikit-learn's handwritten digits twice: with a learning "
            "rate too high and no normalisation, where its ReLUs die, then fixed. Both runs "
            "are recorded under --out with their figures and an HTML report; the alerts say "
            "which layers died and when. Needs layerscope[demo]."
        ),
    )
    parser.add_argument(
        "--out", default="layerscope-demo", help="the folder to write into (default: %(default)s)"
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then serve the dashboard over both runs on http://127.0.0.1:8765",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Train both runs, tell what happened, write the figures."""
    from layerscope._imports import require
    from layerscope.cli._demo_training import BROKEN, FIXED, train

    require("sklearn", "demo")
    require("matplotlib", "plot")
    require("plotly", "ui")
    out = _fresh_folder(Path(args.out))
    output = open_output(args.plain)
    results = []
    for recipe in (BROKEN, FIXED):
        _progress(f"training the {recipe.name} CNN ({recipe.story})")
        results.append(train(recipe, out / recipe.name, _progress))
    broken, fixed = results
    _tell(output, broken, layers=True)
    _tell(output, fixed, layers=False)
    written = [_figures(result) for result in results]
    report = out / "report.html"
    from layerscope.ui import write_report

    write_report(broken.path, report, compare=fixed.path)
    output.fields(
        "next",
        [
            ("report", f"{report} (both runs side by side; opens offline)"),
            ("figures", ", ".join(str(folder) for folder in written)),
            ("dashboard", f"layerscope serve {out}"),
            ("a run in full", f"layerscope summary {broken.path}"),
            ("two runs compared", f"layerscope diff {broken.path} {fixed.path}"),
        ],
    )
    if args.serve:
        from layerscope.ui import serve

        sys.stdout.flush()
        serve(out)
    return 0


def _fresh_folder(out: Path) -> Path:
    """``out``, emptied of an earlier demo's runs; a CommandError if it holds anything else."""
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out: {out} is a file: give a folder")
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise CommandError(f"--out: {out} is not empty and not a demo's folder")
        for name in ("broken", "fixed"):
            shutil.rmtree(out / name, ignore_errors=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).touch()
    except OSError as error:
        raise CommandError(f"--out: cannot make {out}: {error.strerror or error}") from None
    return out


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _tell(output: Output, result: Result, *, layers: bool) -> None:
    """The run's accuracy and alerts; its layers table where ``layers``."""
    from layerscope.cli._summary import show_layers

    run = open_run(str(result.path))
    counts = severity_counts(run)
    output.fields(
        f"{result.recipe.name}: {result.recipe.story}",
        [
            ("run", str(result.path)),
            ("test accuracy", f"{result.accuracy:.1%}"),
            ("steps", f"{run.meta.get('steps')} in {result.seconds:.1f} s"),
            ("alerts", count_line(counts)),
        ],
    )
    if counts:
        output.table(alerts_table(run, ALERTS_SHOWN))
    if layers:
        show_layers(output, run, argparse.Namespace(phase="train", rank=None, kind=None))


def _figures(result: Result) -> Path:
    """The standard figures of ``result``'s run, in its ``plots`` folder."""
    from layerscope.cli._plot import standard_set

    run = open_run(str(result.path))
    folder = result.path / "plots"
    folder.mkdir(exist_ok=True)
    for picture in standard_set(run, ["activation", "grad"], None, "train"):
        try:
            fig = picture.draw(run.plot)
        except ValueError:  # a figure this run has no data for
            continue
        fig.savefig(folder / f"{picture.name}.png", dpi=100)
    return folder
