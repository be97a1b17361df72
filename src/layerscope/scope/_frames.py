"""What a scope recorded, as pandas DataFrames: from memory, or read back from its run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope._imports import require
from layerscope.model import ATTENTION_COLUMNS, KEY_COLUMNS, META_COLUMNS
from layerscope.sinks import MemorySink, join_columns
from layerscope.stats import StatSelection

if TYPE_CHECKING:
    import pandas

TABLES = ("stats", "scalars", "alerts", "attention", "calls")
ALERT_COLUMNS = [
    "step", "phase", "rule", "module", "kind", "tensor",
    "severity", "value", "threshold", "message",
]  # fmt: skip


def stats_columns(stats: StatSelection, histogram: bool) -> list[str]:
    """The stats table's columns, in order, for this selection of statistics."""
    names = [*KEY_COLUMNS, *META_COLUMNS]
    names += [name for name in stats.builtin if name != "hist" or histogram]
    return names + list(stats.custom_columns)


def column_names(table: str, stats: list[str]) -> list[str]:
    """The columns of ``table``; ``stats`` are the stats table's."""
    return {
        "stats": stats,
        "scalars": ["step", "name", "value"],
        "alerts": ALERT_COLUMNS,
        "calls": ["step", "seq", "event", "module", "call"],
        "attention": list(ATTENTION_COLUMNS),
    }[table]


def memory_frame(memory: MemorySink, table: str, stats: list[str]) -> pandas.DataFrame:
    """``table`` of what ``memory`` holds."""
    pd = require("pandas", "dataframe")
    if table == "stats":
        columns = join_columns(memory.chunks)
        rows = len(columns.get("step", []))
        missing = [None] * rows  # a column no chunk has: sentinel rows lack most
        frame = pd.DataFrame({name: columns.get(name, missing) for name in stats})
        if "hist" in frame:
            frame["hist"] = [None if h is None else h.numpy() for h in columns["hist"]]
        return frame
    if table == "scalars":
        return pd.DataFrame(memory.scalars, columns=column_names(table, stats))
    if table == "alerts":
        alerts = [[getattr(alert, name) for name in ALERT_COLUMNS] for alert in memory.alerts]
        return pd.DataFrame(alerts, columns=ALERT_COLUMNS)
    if table == "attention":
        names = column_names(table, stats)
        return pd.DataFrame(list(memory.attention), columns=names)
    from layerscope.store import calls_table, expand_orders

    # Every recorded step's order: a repeated one is kept short, as the store keeps it.
    expanded = expand_orders(calls_table(list(memory.calls), 0))
    names = column_names(table, stats)
    return pd.DataFrame(
        list(zip(*(expanded.column(name).to_pylist() for name in names), strict=True)),
        columns=names,
    )


def stored_frame(path: str, table: str, stats: list[str], rank: int) -> pandas.DataFrame:
    """Rank ``rank``'s rows of ``table`` of the run at ``path``, shaped as ``memory_frame``'s."""
    pd = require("pandas", "dataframe")
    from layerscope.store import load

    try:
        run = load(path)
    except FileNotFoundError:  # nothing written yet: a rank's files come with its rows
        return pd.DataFrame(columns=column_names(table, stats))
    stored: pandas.DataFrame = getattr(run, table)
    if "rank" in stored:  # other ranks of the job write to the same run
        stored = stored[stored["rank"] == rank].reset_index(drop=True)
    if table == "attention":  # its rows name their rank, as the stats table's do
        stored = stored[list(ATTENTION_COLUMNS)]
    elif table != "stats":
        stored = stored.drop(columns="rank", errors="ignore")
    return stored
