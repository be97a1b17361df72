"""SQL over a run: a DuckDB database per ``Run``, and views over its Parquet files.

The views are made again only when the listing of files changed: binding a view reads every
file's schema, which cost most of a small query. Each view has every column its run declares,
NULL where no file has it, so that a query names the same columns whatever files it meets.

Every database still open is closed at exit: a connection still alive when the interpreter
shuts down (a Run kept by a thread, a cycle) makes DuckDB's bindings print "nanobind: leaked
... instances" on stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

from layerscope._imports import require
from layerscope.model import quote_identifier


class Database:
    """One in-memory DuckDB database, opened at its first query: opening one costs ~20 ms.

    Args:
        fs: the fsspec filesystem the run is on; DuckDB reads through it unless it is local.
    """

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._connection: Any = None
        self.opened = 0  # how many times it was opened: views made before are gone
        self._aliases: Any = None  # plain names of files with pattern characters in their paths
        self._lock = threading.Lock()

    def cursor(self) -> Any:
        """A new cursor of the database, which is opened now if it is not yet."""
        if self._connection is None:
            duckdb = require("duckdb", "dataframe")
            self._connection = duckdb.connect(config=_bounds())
            self.opened += 1
            if self._fs.protocol not in ("file", ("file", "local")):
                self._connection.register_filesystem(self._fs)
            if self._aliases is not None:
                self._connection.register_filesystem(self._aliases)
            _OPEN.add(self)
        return self._connection.cursor()

    def url(self, path: str) -> str:
        """How DuckDB is to name the file at ``path``: never as a pattern (``_file_aliases``)."""
        from layerscope.store._file_aliases import FileAliases, needs_alias

        if not needs_alias(path, self._fs):
            return duckdb_url(self._fs, path)
        with self._lock:
            if self._aliases is None:
                self._aliases = FileAliases(self._fs)
                if self._connection is not None:
                    self._connection.register_filesystem(self._aliases)
        url: str = self._aliases.url(path)
        return url

    def close(self) -> None:
        """Close the database; the next query opens it again."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing at exit: nothing left to tell
                connection.close()


def _bounds() -> dict[str, str]:
    """What a run's database may hold in memory, and where it spills the rest.

    A query over tens of millions of rows (ranks merged, a sort) stays within ``MEMORY_LIMIT``
    and writes what does not fit to a folder of its own in the temporary directory, made
    when first needed and removed when the database closes. ``run.sql("set memory_limit =
    '8GB'")`` gives a run's database more.
    """
    folder = f"layerscope-duckdb-{os.getpid()}-{next(_NUMBERS)}"
    return {
        "memory_limit": MEMORY_LIMIT,
        "temp_directory": os.path.join(tempfile.gettempdir(), folder),
    }


#: DuckDB's bound on a run database's memory (its own default: 80% of the machine's).
MEMORY_LIMIT = "1GB"
_NUMBERS = itertools.count(1)  # of the databases opened here: each spills into its own folder

# The databases that are open, each closed at exit (see the module's docstring).
_OPEN: weakref.WeakSet[Database] = weakref.WeakSet()


@atexit.register
def _close_databases() -> None:
    for database in list(_OPEN):
        database.close()


def create_view(
    connection: Any,
    table: str,
    urls: list[str],
    rankless: int,
    declared: Any = None,
    row_numbers: bool = False,
) -> None:
    """Make ``table`` a view over the Parquet files at ``urls``, their columns united by name.

    Args:
        connection: the DuckDB connection (or cursor) the view is made in.
        table: the view's name.
        urls: the files, as DuckDB reads them (see ``Database.url``: names, never patterns);
            at least one.
        rankless: how many of them have no ``rank`` column, written before tables had one:
            their rows are rank 0's.
        declared: an empty Arrow table of the columns the run declares for ``table``: each
            one no file has is in the view too, NULL (see ``declare_columns``).
        row_numbers: the view also has ``file_row_number``, each row's place in its file.
    """
    listing = ", ".join("'" + url.replace("'", "''") + "'" for url in urls)
    numbered = ", file_row_number = true" if row_numbers else ""
    source = f"read_parquet([{listing}], union_by_name = true{numbered})"
    columns = "*"
    if rankless == len(urls):
        columns = "*, 0::integer as rank"
    elif rankless:
        columns = "* replace (coalesce(rank, 0)::integer as rank)"
    declare_columns(connection, table, f"select {columns} from {source}", declared)


def declare_columns(connection: Any, view: str, query: str, declared: Any) -> None:
    """Make ``view`` the rows of ``query`` with every column of ``declared``.

    A file may lack a column its run declares (written before the column was, or rewritten
    by another program): where no file has it, the view has it as a NULL of its declared
    type, so that every reader can name the run's columns and finds their values unknown.

    Args:
        connection: the DuckDB connection (or cursor) the view is made in.
        view: the view's name.
        query: the SQL of its rows, made of names the code declares.
        declared: an empty Arrow table of the columns the view must have, or None for none.
    """
    quoted = quote_identifier(view)
    connection.execute(f"create or replace view {quoted} as {query}")
    if declared is None:
        return
    # DuckDB binds names regardless of case: a column "Numel" answers to numel.
    present = {str(row[0]).lower() for row in connection.execute(f"describe {quoted}").fetchall()}
    schema = connection.from_arrow(declared)  # each Arrow type as DuckDB names it
    missing = [
        f"null::{kind} as {quote_identifier(name)}"
        for name, kind in zip(schema.columns, schema.types, strict=True)
        if name.lower() not in present
    ]
    if missing:
        rows = f"select *, {', '.join(missing)} from ({query})"
        connection.execute(f"create or replace view {quoted} as {rows}")


def create_calls_view(connection: Any, urls: list[str], rankless: int, declared: Any) -> None:
    """Make ``calls`` every recorded step's order, over ``calls_stored``, the files as stored.

    See ``layerscope.store._calls``: a step that repeats the order before it is stored as one
    ``same`` row, which the view expands. Files written before steps were have no ``step``:
    there ``calls`` is the files as they are, with ``step`` NULL.
    """
    from layerscope.store._calls import EXPANDED_CALLS

    # ``step`` is left as the files have it: whether they have it says how to read them.
    stored = declared.drop_columns(["step"])
    create_view(connection, "calls_stored", urls, rankless, stored)
    columns = {row[0] for row in connection.execute("describe calls_stored").fetchall()}
    query = EXPANDED_CALLS if "step" in columns else "select * from calls_stored"
    declare_columns(connection, "calls", query, declared)


def duckdb_url(fs: Any, path: str) -> str:
    """``path`` of ``fs`` as DuckDB names it: plain if local, with the protocol otherwise."""
    protocol = fs.protocol
    protocol = protocol[0] if isinstance(protocol, tuple) else protocol
    return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"


#: The view of ``stats`` with each row's place in its file, the order it was written in.
WRITTEN_STATS = "stats_as_written"


class Views:
    """A view per table over the files listed now, in one run's database, shared by its cursors."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._lock = threading.Lock()
        self._signature: tuple[int, tuple[tuple[str, ...], ...]] | None = None

    def refresh(
        self,
        listing: dict[str, list[str]],
        rankless: set[str],
        declared: Callable[[str], Any],
        derived: Callable[[Any, list[str]], None],
    ) -> list[str]:
        """Make the views over ``listing`` (table -> paths) unless they are that already.

        Args:
            listing: each table's files to read now.
            rankless: the files written before tables had a ``rank`` column.
            declared: an empty Arrow table of a table's declared columns: its view has each.
            derived: makes the views made of the tables' views (given a cursor and the
                tables without files), once these are made.

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
                            urls = [self.database.url(path) for path in paths]
                            count = sum(path in rankless for path in paths)
                            if table == "calls":
                                create_calls_view(connection, urls, count, declared(table))
                            else:
                                create_view(connection, table, urls, count, declared(table))
                            if table == "stats":  # the order written: what merged rows keep
                                create_view(
                                    connection, WRITTEN_STATS, urls, count, declared(table), True
                                )
                        else:
                            connection.execute(f"drop view if exists {quote_identifier(table)}")
                            if table == "stats":
                                connection.execute(f"drop view if exists {WRITTEN_STATS}")
                    derived(connection, [table for table, paths in listing.items() if not paths])
                finally:
                    connection.close()
                # The database may have been opened by the cursor: the views are its.
                self._signature = (self.database.opened, signature[1])
        return [table for table, paths in listing.items() if not paths]
