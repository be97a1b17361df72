"""A scope's in-memory records read as a stored run is read: ``meta``, ``modules`` and ``sql``.

``scope.plot`` of a scope without ``run=`` draws from one: the figures' queries run over Arrow
tables made from the ``MemorySink``'s rows, the same columns, trimmed histograms and all, that
the store writes to Parquet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope._imports import require
from layerscope.sinks import MemorySink, RunInfo
from layerscope.store import (
    alerts_table,
    attention_table,
    calls_table,
    expand_orders,
    scalars_table,
    stats_table,
)

if TYPE_CHECKING:
    import pandas

    from layerscope.model import ModuleInfo
    from layerscope.store import Parameters


class MemoryRun:
    """What a ``MemorySink`` holds now, as tables; later records do not change it.

    Args:
        memory: the sink, started.
        info: what the sink was started with, if it was not started yet.
    """

    def __init__(self, memory: MemorySink, info: RunInfo | None = None) -> None:
        require("pyarrow", "dataframe")
        info = info or memory.info
        if info is None:
            raise ValueError("memory: the sink was never started, so it has no run")
        self.path = None
        self._modules = list(info.modules)
        rank = info.place.peek() or (0, 1)
        self.meta: dict[str, Any] = {
            "name": info.name,
            "id": info.id,
            "status": "running" if memory.summary is None else memory.summary.status,
            "config": info.config,
            "histogram_edges": info.histogram_edges,
        }
        stats = [stats_table(chunk) for chunk in memory.chunks]
        self._tables = {
            "stats": _concat(stats) if stats else _empty_stats(info),
            "scalars": scalars_table(list(memory.scalars), rank[0]),
            "alerts": alerts_table(list(memory.alerts), rank[0]),
            "attention": attention_table(list(memory.attention), rank[0]),
            # As stored, then every recorded step's order (as ``Run.sql`` has them).
            "calls_stored": calls_table(list(memory.calls), rank[0]),
        }
        self._tables["calls"] = expand_orders(self._tables["calls_stored"])

    def __repr__(self) -> str:
        return f"<MemoryRun {self.meta['name']!r} {self.meta['status']}>"

    @property
    def modules(self) -> list[ModuleInfo]:
        """The module tree."""
        return list(self._modules)

    def sql(self, query: str, params: Parameters = None) -> pandas.DataFrame:
        """Run a DuckDB query over the tables stats, scalars, alerts, attention and calls.

        ``params`` binds the query's placeholders, as ``Run.sql``'s does.
        """
        duckdb = require("duckdb", "dataframe")
        connection = duckdb.connect()
        try:
            for name, table in self._tables.items():
                connection.register(name, table)
            frame: pandas.DataFrame = connection.execute(query, params).df()
        finally:
            connection.close()
        return frame


def _concat(tables: list[Any]) -> Any:
    """One table of the chunks' tables, sentinel chunks' missing columns filled with nulls."""
    pyarrow = require("pyarrow", "dataframe")
    # Chunks encode their key columns with dictionaries of their own: plain strings unite.
    plain = [
        table.cast(
            pyarrow.schema(
                [
                    field.with_type(field.type.value_type)
                    if pyarrow.types.is_dictionary(field.type)
                    else field
                    for field in table.schema
                ]
            )
        )
        for table in tables
    ]
    return pyarrow.concat_tables(plain, promote_options="permissive")


def _empty_stats(info: RunInfo) -> Any:
    from layerscope.store import stats_schema

    return stats_schema(
        info.config.get("stats", ()),
        info.config.get("custom_stats", ()),
        histogram=bool(info.histogram_edges),
    ).empty_table()
