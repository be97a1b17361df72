"""SQL over a run: a DuckDB database per ``Run``, and views over its Parquet files.

The views are made again only when the listing of files changed: binding a view reads every
file's schema, which cost most of a small query.

Every database still open is closed at exit: a connection still alive when the interpreter
shuts down (a Run kept by a thread, a cycle) makes DuckDB's bindings print "nanobind: leaked
... instances" on stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from typing import Any

from layerscope._imports import require


class Database:
    """One in-memory DuckDB database, opened at its first query: opening one costs ~20 ms.

    Args:
        fs: the fsspec filesystem the run is on; DuckDB reads through it unless it is local.
    """

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._connection: Any = None
        self.opened = 0  # how many times it was opened: views made before are gone

    def cursor(self) -> Any:
        """A new cursor of the database, which is opened now if it is not yet."""
        if self._connection is None:
            duckdb = require("duckdb", "dataframe")
            self._connection = duckdb.connect()
            self.opened += 1
            if self._fs.protocol not in ("file", ("file", "local")):
                self._connection.register_filesystem(self._fs)
            _OPEN.add(self)
        return self._connection.cursor()

    def close(self) -> None:
        """Close the database; the next query opens it again."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing at exit: nothing left to tell
                connection.close()


# The databases that are open, each closed at exit (see the module's docstring).
_OPEN: weakref.WeakSet[Database] = weakref.WeakSet()


@atexit.register
def _close_databases() -> None:
    for database in list(_OPEN):
        database.close()


def create_view(connection: Any, table: str, urls: list[str], rankless: int) -> None:
    """Make ``table`` a view over the Parquet files at ``urls``, their columns united by name.

    Args:
        connection: the DuckDB connection (or cursor) the view is made in.
        table: the view's name.
        urls: the files, as DuckDB reads them (see ``duckdb_url``); at least one.
        rankless: how many of them have no ``rank`` column, written before tables had one:
            their rows are rank 0's.
    """
    listing = ", ".join("'" + url.replace("'", "''") + "'" for url in urls)
    source = f"read_parquet([{listing}], union_by_name = true)"
    columns = "*"
    if rankless == len(urls):
        columns = "*, 0::integer as rank"
    elif rankless:
        columns = "* replace (coalesce(rank, 0)::integer as rank)"
    connection.execute(f"create or replace view {table} as select {columns} from {source}")


def create_calls_view(connection: Any, urls: list[str], rankless: int) -> None:
    """Make ``calls`` every recorded step's order, over ``calls_stored``, the files as stored.

    See ``layerscope.store._calls``: a step that repeats the order before it is stored as one
    ``same`` row, which the view expands. Files written before steps were have no ``step``:
    there ``calls`` is the files as they are.
    """
    from layerscope.store._calls import EXPANDED_CALLS

    create_view(connection, "calls_stored", urls, rankless)
    columns = {row[0] for row in connection.execute("describe calls_stored").fetchall()}
    query = EXPANDED_CALLS if "step" in columns else "select * from calls_stored"
    connection.execute(f"create or replace view calls as {query}")


def duckdb_url(fs: Any, path: str) -> str:
    """``path`` of ``fs`` as DuckDB names it: plain if local, with the protocol otherwise."""
    protocol = fs.protocol
    protocol = protocol[0] if isinstance(protocol, tuple) else protocol
    return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"


class Views:
    """A view per table over the files listed now, in one run's database, shared by its cursors."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._lock = threading.Lock()
        self._signature: tuple[int, tuple[tuple[str, ...], ...]] | None = None

    def refresh(self, fs: Any, listing: dict[str, list[str]], rankless: set[str]) -> list[str]:
        """Make the views over ``listing`` (table -> paths) unless they are that already.

        Args:
            fs: the fsspec filesystem of the paths.
            listing: each table's files to read now.
            rankless: the files written before tables had a ``rank`` column.

        Returns:
            The tables that have no file.
        """
        signature = (self.database.opened, tuple(tuple(paths) for paths in listing.values()))
        with self._lock:
            if signature != self._signature:
                connection = self.database.cursor()
                try:
                    for table, paths in listing.items():
                        if paths:
                            urls = [duckdb_url(fs, path) for path in paths]
                            count = sum(path in rankless for path in paths)
                            if table == "calls":
                                create_calls_view(connection, urls, count)
                            else:
                                create_view(connection, table, urls, count)
                        else:
                            connection.execute(f"drop view if exists {table}")
                finally:
                    connection.close()
                # The database may have been opened by the cursor: the views are its.
                self._signature = (self.database.opened, signature[1])
        return [table for table, paths in listing.items() if not paths]
