"""Files whose footer is sound but whose pages are not: found when a query fails, left out.

A file's footer is checked before it is read (``_segment_checks``); its pages are read only
by the queries that need them, and reading them all up front would cost as much as reading
the run. So when a query over the run fails in a way a file could cause, each file not yet
known to read whole is read alone: those that fail are damaged, and the query can be made
again without them. A query that fails on sound files fails as it did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from layerscope._imports import require
from layerscope.store._sql import Database
from layerscope.store._tables import UNREADABLE_DATA

# Errors of the query's own text, or of its being stopped: no file is to blame.
_QUERY_ERRORS = (
    "ParserException",
    "SyntaxException",
    "BinderException",
    "CatalogException",
    "InterruptException",
)
# Every value of every column decoded, one row out.
_READ_WHOLE = "select max(hash(columns(*))) from read_parquet([?])"


class PageChecks:
    """Which of a run's files DuckDB read whole, once a query made it look.

    Args:
        fs: the fsspec filesystem of the run.
        database: the run's database, which names its files (``Database.url``).
    """

    def __init__(self, fs: Any, database: Database) -> None:
        self._fs = fs
        self._database = database
        self._whole: set[str] = set()

    def after_failure(
        self,
        error: BaseException,
        listed: Iterable[list[str]],
        reject: Callable[[str, str], object],
    ) -> bool:
        """Whether to make a query that failed with ``error`` again, over the files listed anew.

        Yes when a file it read (of ``listed``, each table's) has gone since it was listed
        (compacted meanwhile), or when some are damaged: each is given to ``reject`` with why.
        """
        if type(error).__name__ in _QUERY_ERRORS:
            return False
        damaged = self.damaged([path for paths in listed for path in paths])
        for path, reason in damaged or ():
            reject(path, reason)
        return damaged is None or bool(damaged)

    def damaged(self, paths: list[str]) -> list[tuple[str, str]] | None:
        """Those of ``paths`` DuckDB cannot read whole, each with why.

        Returns:
            None when one of ``paths`` has gone (compacted meanwhile): list the files again.
        """
        duckdb = require("duckdb", "dataframe")
        fs = self._fs
        if not all(fs.exists(path) for path in paths):
            return None
        found = []
        cursor = self._database.cursor()
        try:
            for path in paths:
                if path in self._whole:
                    continue
                try:
                    cursor.execute(_READ_WHOLE, [self._database.url(path)]).fetchall()
                except duckdb.Error as error:
                    if not fs.exists(path):
                        return None
                    first_line = (str(error).strip().splitlines() or [""])[0]
                    found.append(
                        (path, f"{UNREADABLE_DATA} ({type(error).__name__}: {first_line})")
                    )
                else:
                    self._whole.add(path)
        finally:
            cursor.close()
        return found
