"""``layerscope runs [DIR]``: the runs under a folder, their status, steps and alerts.

A run whose ``run.json`` cannot be read is listed as ``unreadable``, and why is said below the
table, one line each: one damaged run does not hide the others.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from layerscope.cli import _format
from layerscope.cli._console import Column, Table, open_output
from layerscope.cli._open import list_runs

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
    listed = list_runs(args.dir)
    output = open_output(args.plain)
    if listed.empty:
        output.line(f"no runs under {args.dir}")
        return 0
    records = listed.to_dict("records")
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
                _alert_count(record["path"]),
            ]
        table.add(
            cells + ([record["path"]] if renamed else []), STATUS_STYLES.get(record["status"])
        )
    output.table(table)
    if unreadable:
        output.fields("unreadable runs", unreadable)
    return 0


def _alert_count(path: str) -> str:
    """How many alerts the run has: its alerts table alone is read, a few small files."""
    from layerscope.store import load

    try:
        return str(len(load(path).alerts))
    except Exception:  # removed or damaged since it was listed: one run's, not the listing's
        return _format.MISSING


def _count(value: Any) -> str:
    """A count of the frame (nullable integers: NA where the run does not say)."""
    import pandas

    return _format.MISSING if pandas.isna(value) else _format.number(value)


def _time(value: Any) -> str:
    """A pandas Timestamp (UTC) to the second; ``-`` for none (NaT is not equal to itself)."""
    if value is None or value != value:
        return _format.MISSING
    return str(value.strftime("%Y-%m-%d %H:%M:%S UTC"))


def _folder(path: str) -> str:
    return os.path.basename(path.rstrip("/"))
