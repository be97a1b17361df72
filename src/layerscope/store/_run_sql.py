"""SQL over one run: DuckDB views of the files its reader lists now, and queries over them.

A query that fails because a file it read went meanwhile (a run being compacted) is made again
over a new listing; one that fails on a file whose footer is sound but whose pages are not is
made again without that file, which is named (``_page_checks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from layerscope._imports import require
from layerscope.model import quote_identifier
from layerscope.store._merged_sql import MERGED_VIEW, SHAPES_TABLE, merged_view_sql
from layerscope.store._page_checks import PageChecks
from layerscope.store._sql import Database, Views
from layerscope.store._tables import RETRIES

if TYPE_CHECKING:
    import pandas


class RunSql:
    """The queries of one ``Run``.

    Args:
        fs: the fsspec filesystem of the run.
        listing: each table's files to read now (table -> paths); a file not to read is left
            out, and named, by the reader.
        empty: an empty Arrow table of a table's columns, for a table no file holds yet.
        reject: leaves out a file (path, why) that could not be read.
        rankless: the files written before tables had a ``rank`` column, as ``listing`` finds
            them.
        merging: the custom statistics' names and the sharded parameters' whole shapes
            (module, tensor, shape), that the view ``merged_stats`` merges ranks' rows with.
    """

    def __init__(
        self,
        fs: Any,
        listing: Callable[[], dict[str, list[str]]],
        empty: Callable[[str], Any],
        reject: Callable[[str, str], object],
        rankless: set[str],
        merging: Callable[[], tuple[tuple[str, ...], list[tuple[str, str, list[int]]]]],
    ) -> None:
        self._listing = listing
        self._empty = empty
        self._reject = reject
        self._rankless = rankless
        self._merging = merging
        self._views = Views(Database(fs))
        self._pages = PageChecks(fs, self._views.database)
        self._listed: dict[str, list[str]] = {}  # each table's files, as the views read them
        self._merged_ordered = ""  # merged_stats' query, its rows in the order written

    def query(self, query: str, params: Any = None) -> pandas.DataFrame:
        """``query``, its placeholders bound to ``params``, over the files listed now."""
        frame: pandas.DataFrame = self._retried(
            lambda: self._query(lambda cursor: cursor.execute(query, params).df())
        )
        return frame

    def merged(self, limit: int | None) -> Any:
        """The rows of ``merged_stats`` in the order written, at most ``limit``, as Arrow."""
        tail = "" if limit is None else f" limit {int(limit)}"
        # The query is made with the views, from the columns the files have now.
        return self._retried(
            lambda: self._query(lambda cursor: _arrow_table(cursor, self._merged_ordered + tail))
        )

    def _retried(self, attempt: Callable[[], Any]) -> Any:
        """``attempt()``, made again over a new listing when a file went or was damaged."""
        duckdb = require("duckdb", "dataframe")
        for _ in range(RETRIES - 1):
            try:
                return attempt()
            except FileNotFoundError:
                continue  # a run being compacted: a listed segment went before it was read
            except duckdb.Error as error:  # damaged pages: their file left out, named
                if not self._pages.after_failure(error, self._listed.values(), self._reject):
                    raise
        return attempt()

    def _query(self, result: Callable[[Any], Any]) -> Any:
        """``result(cursor)``, over a view per table of the files the directory lists now."""
        self._listed = self._listing()
        empty = self._views.refresh(self._listed, self._rankless, self._empty, self._derive)
        connection = self._views.database.cursor()
        try:
            for table in empty:  # a table no file holds yet: its columns, no rows
                connection.register(table, self._empty(table))
                if table == "stats":
                    connection.register(MERGED_VIEW, self._empty(table))
            return result(connection)
        finally:
            connection.close()

    def _derive(self, connection: Any, empty: list[str]) -> None:
        """Make ``merged_stats``, the ranks' rows merged, over the view ``stats``."""
        pyarrow = require("pyarrow", "dataframe")
        custom, shapes = self._merging()
        modules, tensors, whole = zip(*shapes, strict=True) if shapes else ((), (), ())
        table = pyarrow.table(
            {
                "module": pyarrow.array(modules, pyarrow.string()),
                "tensor": pyarrow.array(tensors, pyarrow.string()),
                "shape": pyarrow.array(whole, pyarrow.list_(pyarrow.int64())),
            }
        )
        connection.register("shapes_of_parameters", table)
        try:
            connection.execute(
                f"create or replace table {SHAPES_TABLE} as select * from shapes_of_parameters"
            )
        finally:
            connection.unregister("shapes_of_parameters")
        if "stats" in empty:
            connection.execute(f"drop view if exists {MERGED_VIEW}")
            return
        columns = []
        for name, kind, *_ in connection.execute("describe stats").fetchall():
            try:  # a column another program named with a control character: not merged
                quote_identifier(name)
            except ValueError:
                continue
            columns.append((name, kind))
        connection.execute(
            f"create or replace view {MERGED_VIEW} as {merged_view_sql(columns, custom)}"
        )
        self._merged_ordered = merged_view_sql(columns, custom, ordered=True)


def _arrow_table(cursor: Any, query: str) -> Any:
    """The rows of ``query`` as Arrow, without the copy a DB-API result's conversion makes."""
    relation = cursor.sql(query)
    convert = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table
    return convert()
