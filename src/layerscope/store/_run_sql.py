"""SQL over one run: DuckDB views of the files its reader lists now, and queries over them.

A query that fails because a file it read went meanwhile (a run being compacted) is made again
over a new listing; one that fails on a file whose footer is sound but whose pages are not is
made again without that file, which is named (``_page_checks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from layerscope._imports import require
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
    """

    def __init__(
        self,
        fs: Any,
        listing: Callable[[], dict[str, list[str]]],
        empty: Callable[[str], Any],
        reject: Callable[[str, str], object],
        rankless: set[str],
    ) -> None:
        self._listing = listing
        self._empty = empty
        self._reject = reject
        self._rankless = rankless
        self._views = Views(Database(fs))
        self._pages = PageChecks(fs, self._views.database)
        self._listed: dict[str, list[str]] = {}  # each table's files, as the views read them

    def query(self, query: str, params: Any = None) -> pandas.DataFrame:
        """``query``, its placeholders bound to ``params``, over the files listed now."""
        duckdb = require("duckdb", "dataframe")
        for _ in range(RETRIES - 1):
            try:
                return self._query(query, params)
            except FileNotFoundError:
                continue  # a run being compacted: a listed segment went before it was read
            except duckdb.Error as error:  # damaged pages: their file left out, named
                if not self._pages.after_failure(error, self._listed.values(), self._reject):
                    raise
        return self._query(query, params)

    def _query(self, query: str, params: Any) -> pandas.DataFrame:
        """``query`` over a view per table of the files the directory lists now."""
        self._listed = self._listing()
        empty = self._views.refresh(self._listed, self._rankless, self._empty)
        connection = self._views.database.cursor()
        try:
            for table in empty:  # a table no file holds yet: its columns, no rows
                connection.register(table, self._empty(table))
            frame: pandas.DataFrame = connection.execute(query, params).df()
        finally:
            connection.close()
        return frame
