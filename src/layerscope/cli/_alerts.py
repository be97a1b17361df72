"""A run's alerts for the commands, in the current schema or the older one, or none at all.

The current alerts table has step, phase, rule, module, kind, tensor, severity, value,
threshold, message, rank; runs written before it have step, rule, module, kind, severity,
message, rank. The queries name only the columns the run has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope.cli import _format
from layerscope.cli._console import Column, Table
from layerscope.cli._layers import shown_name
from layerscope.model import quote_identifier

if TYPE_CHECKING:
    from layerscope.store import Run

# Rows of the more severe alerts stand out in a terminal; plain text shows the word only.
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow"}
_SEVERITY_ORDER = ("error", "warning", "info")
# Shown in this order where the run has them; tensor and phase are the newer schema's.
_SHOWN = ("step", "phase", "rank", "severity", "rule", "module", "kind", "tensor", "message")


def severity_counts(run: Run) -> dict[str, int]:
    """How many alerts of each severity the run has, the most severe first."""
    frame = run.sql("select severity, count(*) as n from alerts group by severity")
    counts = {
        _format.text(severity): int(n) for severity, n in zip(frame.severity, frame.n, strict=True)
    }
    known = [severity for severity in _SEVERITY_ORDER if severity in counts]
    return {severity: counts[severity] for severity in known + sorted(set(counts) - set(known))}


def count_line(counts: dict[str, int]) -> str:
    """``3 alerts (1 error, 2 warning)``, or ``no alerts``.

    Examples:
        >>> count_line({"error": 1, "warning": 2}), count_line({"info": 1}), count_line({})
        ('3 alerts (1 error, 2 warning)', '1 alert (1 info)', 'no alerts')
    """
    total = sum(counts.values())
    if not total:
        return "no alerts"
    each = ", ".join(f"{n} {severity}" for severity, n in counts.items())
    return f"{total} alert{'s' if total > 1 else ''} ({each})"


def alerts_table(run: Run, limit: int | None) -> Table:
    """The run's first ``limit`` alerts (all if None) in step order, as a table.

    ``phase`` and ``rank`` are shown only where they tell something: a phase other than
    train, more than one rank.
    """
    columns = set(run.sql("select * from alerts limit 0").columns)
    shown = [name for name in _SHOWN if name in columns]
    if "phase" in shown and not _varies(run, "phase", default="train"):
        shown.remove("phase")
    if "rank" in shown and len(run.meta.get("ranks", ())) < 2:
        shown.remove("rank")
    if "tensor" in shown and not _held(run, "tensor"):  # files older than the column
        shown.remove("tensor")
    order = ", ".join(quote_identifier(name) for name in ("step", "rank") if name in columns)
    query = f"select {', '.join(map(quote_identifier, shown))} from alerts"
    if order:
        query += f" order by {order}"
    if limit is not None:
        query += " limit $limit"
    frame = run.sql(query, None if limit is None else {"limit": int(limit)})
    table = Table("alerts", [Column(name, numeric=name in ("step", "rank")) for name in shown])
    for record in frame.itertuples(index=False):
        values = record._asdict()
        cells = [_cell(name, values[name]) for name in shown]
        table.add(cells, style=SEVERITY_STYLES.get(_format.text(values.get("severity"))))
    return table


def _cell(column: str, value: object) -> str:
    if column in ("step", "rank"):
        return _format.number(value)
    if column == "module" and value == "":
        return shown_name(value)
    return _format.text(value)


def _varies(run: Run, column: str, default: str) -> bool:
    """Whether any alert has a ``column`` (one of ``_SHOWN``) other than ``default``."""
    if column not in _SHOWN:
        raise ValueError(f"column: expected one of {_SHOWN}, got {column!r}")
    frame = run.sql(
        f"select count(*) as n from alerts"
        f" where coalesce({quote_identifier(column)}, $default) <> $default",
        {"default": default},
    )  # NULL where the files lack the column (older runs): not known, so not other
    return bool(frame.n.iloc[0])


def _held(run: Run, column: str) -> bool:
    """Whether any alert has a value of ``column``; none does where the files lack it."""
    frame = run.sql(f"select count({quote_identifier(column)}) as n from alerts")
    return bool(frame.n.iloc[0])
