"""``layerscope export RUN``: a recorded run replayed into TensorBoard, W&B or MLflow.

The run's rows go through the same sink classes that ``watch(sinks=...)`` writes to, so an
exported run reads as one that had the sink from the start. The run is read a range of steps
at a time through ``run.sql``, so a large run never loads at once.
"""

from __future__ import annotations

import argparse
import difflib
import os
from typing import TYPE_CHECKING

from layerscope.cli import _queries
from layerscope.cli._arguments import RUN_METAVAR
from layerscope.cli._console import open_output
from layerscope.cli._open import CommandError, open_run
from layerscope.cli._storage_options import storage_options
from layerscope.cli._visible import visible

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers
    from layerscope.store import Run


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``export``'s parser."""
    parser = subparsers.add_parser(
        "export",
        help="replay a run into TensorBoard, W&B or MLflow",
        description=(
            "Send a recorded run's statistics, histograms, scalars and alerts to TensorBoard, "
            "Weights & Biases or MLflow, as layerscope.sinks.TensorBoard, WandB and MLflow "
            "would have during training. Rows of one rank are sent (default: rank 0)."
        ),
    )
    parser.add_argument("run", metavar=RUN_METAVAR, help="the run's directory (or fsspec URL)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files")
    target.add_argument("--wandb", action="store_true", help="log to a new W&B run")
    target.add_argument("--mlflow", action="store_true", help="log to a new MLflow run")
    parser.add_argument("--project", help="with --wandb: the W&B project")
    parser.add_argument("--tracking-uri", help="with --mlflow: the tracking URI")
    parser.add_argument("--experiment", help="with --mlflow: the experiment, created if missing")
    parser.add_argument(
        "--stats",
        help="the statistics to send, comma-separated (default: mean,std,absmax,l2,zero_frac,"
        "nan_count)",
    )
    parser.add_argument("--rank", type=int, default=0, help="whose rows to send (default: 0)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Replay ``args.run`` into the chosen sink and say what was sent."""
    from layerscope.cli import _replay  # torch and the sinks: imported when a run is sent

    recorded = open_run(args.run, storage_options(args))
    _queries.checked_rank(recorded, args.rank)
    _check_stats(recorded, args.stats)
    sink, destination = _replay.chosen_sink(args)
    if args.tensorboard is not None and "://" not in args.tensorboard:
        _make_folder(args.tensorboard)
    sent = _replay.Sent()
    try:
        _replay.send(recorded, args.rank, sink, sent)
    except ImportError:
        raise  # a missing extra: main says what to install
    except Exception as error:  # the tracker's own failure, in one line rather than a trace
        first = (str(error).splitlines() or [""])[0]
        raise CommandError(f"{type(sink).__name__}: {type(error).__name__}: {first}") from error
    where = destination(sink)
    open_output(args.plain).line(
        f"exported {args.run} (rank {args.rank}, {sent.steps_text()}): {sent.rows} rows of "
        f"statistics, {sent.scalars} scalars, {sent.alerts} alerts to {where}"
    )
    return 0


def _check_stats(recorded: Run, stats: str | None) -> None:
    """A CommandError for a ``--stats`` name that is none of the run's statistics."""
    if stats is None:
        return
    config = recorded.meta.get("config") or {}
    known = [n for n in (*config.get("stats", ()), *config.get("custom_stats", ())) if n != "hist"]
    for name in (n for n in stats.split(",") if n):
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise CommandError(
                f"--stats: the run has no statistic {visible(name)!r}; {hint}its statistics: "
                f"{', '.join(known)}"
            )


def _make_folder(path: str) -> None:
    """Make the local folder ``--tensorboard`` names now: one that cannot be is one line."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        reason = error.strerror or str(error)
        raise CommandError(f"--tensorboard: cannot write {path}: {reason}") from None
