"""``layerscope plot RUN``: the standard figures of a run, as PNG files in a folder."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.cli._arguments import PHASES, RUN_METAVAR, regex
from layerscope.cli._console import Column, Table, open_output
from layerscope.cli._open import CommandError, open_run
from layerscope.cli._progress import progress
from layerscope.cli._queries import KIND_NAMES
from layerscope.cli._storage_options import storage_options

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from layerscope.cli._command import Subparsers
    from layerscope.plots import RunPlots
    from layerscope.store import Run

# The kinds drawn when none is asked for: per-call tensors; parameters have figures of their own.
DEFAULT_KINDS = ("activation", "grad")
# The resolutions ``--dpi`` takes: below 10 matplotlib cannot size a small font; print needs
# no more than 600, and at 1,200 the standard set of a 3-layer run takes 1.8 GB and 80 s.
DPI_RANGE = (10, 600)


@dataclass(frozen=True)
class Picture:
    """One file of the standard set: its name, and the ``run.plot`` method that draws it."""

    name: str
    method: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def draw(self, plots: RunPlots) -> Figure:
        """The figure."""
        figure: Figure = getattr(plots, self.method)(**self.arguments)
        return figure


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``plot``'s parser."""
    parser = subparsers.add_parser(
        "plot",
        help="write a run's standard figures as PNG files",
        description=(
            "Write the standard figures of a run into a folder: per kind, mean and std per "
            "layer, the absmax heat map and the log2 histograms over steps (color_dim); the "
            "dead chart, gradient norms, update ratios and scalars with alerts where the run "
            "has them. A figure the run has no data for is skipped with a line saying why."
        ),
    )
    parser.add_argument("run", metavar=RUN_METAVAR, help="the run's directory (or fsspec URL)")
    parser.add_argument(
        "--kind",
        action="append",
        choices=KIND_NAMES,
        help="draw this kind's figures (repeatable; default: activation and grad)",
    )
    parser.add_argument(
        "--modules", type=regex, help="a regex: only the modules whose names it matches"
    )
    parser.add_argument("--phase", default="train", choices=PHASES)
    parser.add_argument("--out", help="the folder to write into (default: RUN/plots)")
    parser.add_argument(
        "--dpi", type=int, default=100, help="resolution, 10 to 600 dots per inch (default: 100)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Draw and write every figure of the standard set the run can draw."""
    from layerscope._imports import require

    require("matplotlib", "plot")
    low, high = DPI_RANGE
    if not low <= args.dpi <= high:
        raise CommandError(f"--dpi: expected {low} to {high} dots per inch, got {args.dpi}")
    loaded = open_run(args.run, storage_options(args))
    out = _out_folder(loaded, args.out)
    kinds = args.kind or [kind for kind in DEFAULT_KINDS if kind in _kinds(loaded)]
    present = _kinds(loaded)
    skipped = [(kind, f"the run has no {kind!r} rows") for kind in kinds if kind not in present]
    kinds = [kind for kind in kinds if kind in present]
    written = []
    pictures = list(standard_set(loaded, kinds, args.modules, args.phase))
    with progress("drawing figures", len(pictures)) as advance:
        for picture in pictures:
            try:
                fig = picture.draw(loaded.plot)
            except ValueError as error:  # no rows of this kind, no histograms, no update
                skipped.append((picture.name, str(error)))
                continue
            finally:
                advance()
            path = out / f"{picture.name}.png"
            try:
                fig.savefig(path, dpi=args.dpi)
            except OSError as error:  # a folder of that name, a full disk
                reason = error.strerror or str(error)
                raise CommandError(f"--out: cannot write {path}: {reason}") from None
            written.append([picture.name, str(path)])
    output = open_output(args.plain)
    if written:
        table = Table(f"figures of {args.run}", [Column("figure"), Column("file")])
        for row in written:
            table.add(row)
        output.table(table)
    if skipped:
        output.fields("skipped", skipped)
    if not written:
        raise CommandError(f"{args.run}: nothing to draw")
    return 0


def standard_set(run: Run, kinds: list[str], modules: str | None, phase: str) -> list[Picture]:
    """The figures ``layerscope plot`` writes, in order, for ``kinds``."""
    present = _kinds(run)
    on = {"modules": modules, "phase": phase}
    pictures = []
    for kind in kinds:
        pictures += [
            Picture(f"stats-{kind}", "stats", {"kind": kind, **on}),
            Picture(f"heatmap-{kind}-absmax", "heatmap", {"stat": "absmax", "kind": kind, **on}),
            Picture(f"color_dim-{kind}", "color_dim", {"kind": kind, **on}),
        ]
    if "activation" in kinds:
        pictures.append(Picture("dead_chart", "dead_chart", on))
    if "weight_grad" in present:
        pictures.append(Picture("grad_norms", "grad_norms", on))
    if "update" in present:
        pictures.append(Picture("update_ratio", "update_ratio", on))
    if len(run.sql("select 1 from scalars limit 1")):
        pictures.append(Picture("scalars", "scalars"))
    return pictures


def _kinds(run: Run) -> set[str]:
    frame = run.sql("select distinct kind from stats where not coalesce(sentinel, false)")
    return set(frame["kind"])


def _out_folder(run: Run, out: str | None) -> Path:
    """``out``, or the run's ``plots`` folder; made if missing."""
    if out is None:
        if not os.path.isdir(run.path):
            raise CommandError(f"--out: {run.path} is not a local folder; give --out DIR")
        out = os.path.join(run.path, "plots")
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"--out: cannot make {out}: {error.strerror}") from None
    return folder
