"""``layerscope runs [DIR]``: the runs under a folder, their status, steps and alerts.

A run whose ``run.json`` cannot be read is listed as ``unreadable``, and why is said below the
table, one line each: one damaged run does not hide the others.
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import TYPE_CHECKING, Any

from layerscope.cli import _format
from layerscope.cli._console import Column, Table, open_output
from layerscope.cli._open import list_run_rows
from layerscope.cli._storage_options import storage_options

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers

UNREADABLE = "unreadable"  # as layerscope.store.runs says it
STATUS_STYLES = {
    "crashed": "bold red",
    "failed": "red",
    "running": "cyan",
    "finished": "green",
    UNREADABLE: "bold red",
}


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``runs``' parser."""
    parser = subparsers.add_parser(
        "runs",
        help="the runs under a folder",
        description="List the runs directly under DIR: name, status, steps, ranks, start "
        "time and number of alerts. A run marked running whose writer stopped shows crashed; "
        "one whose run.json cannot be read shows unreadable, and why.",
    )
    parser.add_argument(
        "dir", nargs="?", default="runs", metavar="DIR", help="the folder (default: runs)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the runs under ``args.dir``."""
    options = storage_options(args)
    records = list_run_rows(args.dir, options)
    output = open_output(args.plain)
    if not records:
        output.line(f"no runs under {args.dir}")
        return 0
    # A run's name is its folder's unless watch() was given another: then say where it is.
    renamed = any(record["name"] != _folder(record["path"]) for record in records)
    columns = [
        Column("name"),
        Column("status"),
        Column("steps", numeric=True),
        Column("ranks", numeric=True),
        Column("started"),
        Column("alerts", numeric=True),
    ]
    table = Table(f"runs under {args.dir}", columns + ([Column("path")] if renamed else []))
    unreadable = []
    for record in records:
        name = _format.text(record["name"])
        if record["status"] == UNREADABLE:
            unreadable.append((name, str(record["error"])))
            cells = [name, UNREADABLE, *[_format.MISSING] * 4]
        else:
            cells = [
                name,
                _format.text(record["status"]),
                _count(record["steps"]),
                _count(record["ranks"]),
                _time(record["started"]),
                _alert_count(record, options),
            ]
        table.add(
            cells + ([record["path"]] if renamed else []), STATUS_STYLES.get(record["status"])
        )
    output.table(table)
    if unreadable:
        output.fields("unreadable runs", unreadable)
    return 0


def _alert_count(record: dict[str, Any], options: dict[str, Any]) -> str:
    """How many alerts the run has, as its ``run.json`` counts them.

    A run from before ``run.json`` counted them has its alerts table read, a few small files;
    so has a crashed run, whose writer may have died between a segment and ``run.json``.
    """
    if record["alerts"] is not None and record["status"] != "crashed":
        return _format.number(record["alerts"])
    from layerscope.store import load

    try:
        return str(len(load(record["path"], storage_options=options).alerts))
    except Exception:  # removed or damaged since it was listed: one run's, not the listing's
        return _format.MISSING


def _count(value: Any) -> str:
    """A count the run's ``run.json`` gives; ``-`` where it does not say."""
    return _format.MISSING if value is None else _format.number(value)


def _time(seconds: float | None) -> str:
    """Seconds since the epoch, in UTC, to the second; ``-`` for none."""
    if seconds is None:
        return _format.MISSING
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _folder(path: str) -> str:
    return os.path.basename(path.rstrip("/"))
