"""Reading runs: ``load(path)`` gives a ``Run``; ``runs(root)`` lists the runs under a folder.

A run can be read while it is being written: segments appear atomically, and every table
access lists the files anew. A damaged file is skipped with a warning and the rest is read.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from typing import TYPE_CHECKING, Any

from layerscope._errors import LayerscopeWarning
from layerscope._imports import require
from layerscope._modules import ModuleInfo
from layerscope._table import KEY_COLUMNS, META_COLUMNS
from layerscope.store._layout import (
    CALLS_FILE,
    MODULES_FILE,
    RUN_FILE,
    SCHEMA_VERSION,
    SEGMENTED_TABLES,
    files_to_read,
)

if TYPE_CHECKING:
    import pandas

TABLES = (*SEGMENTED_TABLES, "calls")
_RETRIES = 10


class Run:
    """A run on disk (or any fsspec filesystem): its tables as DataFrames, and SQL over them.

    Attributes:
        path: where the run is.
        meta: the contents of ``run.json`` when the run was loaded, with ``status`` saying
            ``"crashed"`` for a run still marked running whose process is gone.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        fsspec = require("fsspec", "dataframe")
        self.path = os.fspath(path)
        self._fs, self._root = fsspec.core.url_to_fs(self.path)
        try:
            with self._fs.open(self._join(RUN_FILE), "rb") as file:
                meta = json.load(file)
        except FileNotFoundError:
            raise FileNotFoundError(f"path: no run at {self.path} (no {RUN_FILE})") from None
        if meta.get("schema", 1) > SCHEMA_VERSION:
            raise ValueError(
                f"path: {self.path} was written by a newer layerscope (schema "
                f"{meta['schema']}); this one reads up to schema {SCHEMA_VERSION}"
            )
        meta["status"] = _status(meta)
        self.meta: dict[str, Any] = meta
        self._duckdb: Any = None

    def __repr__(self) -> str:
        return f"<Run {self.meta.get('name')!r} {self.meta['status']}, {self.path}>"

    @property
    def modules(self) -> list[ModuleInfo]:
        """The module tree."""
        with self._fs.open(self._join(MODULES_FILE), "rb") as file:
            entries = json.load(file)
        return [
            ModuleInfo(
                name=entry["name"],
                type=entry["type"],
                parameters={key: tuple(shape) for key, shape in entry["parameters"].items()},
                num_parameters=entry["num_parameters"],
                num_parameters_total=entry["num_parameters_total"],
                children=tuple(entry["children"]),
                watched=entry["watched"],
            )
            for entry in entries
        ]

    @property
    def stats(self) -> pandas.DataFrame:
        """One row per step, phase, rank, module, kind, tensor and call."""
        from layerscope.store._arrow import widen_histograms

        frame = self._frame("stats")
        if "shape" in frame:
            frame["shape"] = [tuple(shape) for shape in frame["shape"]]
        edges = self.meta.get("histogram_edges")
        if edges:
            widen_histograms(frame, len(edges))
        config = self.meta.get("config", {})
        order = [
            *KEY_COLUMNS,
            *META_COLUMNS,
            *config.get("stats", ()),
            *config.get("custom_stats", ()),
        ]
        known = [name for name in order if name in frame]
        return frame[known + [name for name in frame if name not in known]]

    @property
    def scalars(self) -> pandas.DataFrame:
        """step, name, value: what ``scope.step(**scalars)`` recorded."""
        return self._frame("scalars")

    @property
    def alerts(self) -> pandas.DataFrame:
        """step, rule, module, kind, severity, message."""
        return self._frame("alerts")

    @property
    def calls(self) -> pandas.DataFrame:
        """seq, event, module, call: the order of one forward pass."""
        return self._frame("calls")

    def sql(self, query: str) -> pandas.DataFrame:
        """Run a DuckDB query over the tables ``stats``, ``scalars``, ``alerts``, ``calls``.

        Histograms are stored trimmed: ``hist`` holds the counts from slot ``hist_lo`` on.

        Example::

            run.sql("select module, max(absmax) from stats where kind = 'grad' group by 1")
        """
        duckdb = require("duckdb", "dataframe")
        for _ in range(_RETRIES - 1):
            try:
                return self._query(query)
            except (FileNotFoundError, duckdb.IOException):
                continue  # a run being compacted: a listed segment went before it was read
        return self._query(query)

    def _query(self, query: str) -> pandas.DataFrame:
        """``query`` over a view per table of the files the directory lists now."""
        connection = self._database().cursor()
        try:
            self._create_views(connection)
            frame: pandas.DataFrame = connection.execute(query).df()
        finally:
            connection.close()
        return frame

    def _create_views(self, connection: Any) -> None:
        for table in TABLES:
            files = [self._url(path) for path in self._readable(table)]
            if files:
                listing = ", ".join("'" + path.replace("'", "''") + "'" for path in files)
                connection.execute(
                    f"create or replace temp view {table} as select * from "
                    f"read_parquet([{listing}], union_by_name = true)"
                )
            else:
                connection.register(table, _empty(table))

    def _database(self) -> Any:
        """One in-memory DuckDB database per Run: opening one costs ~20 ms a query."""
        if self._duckdb is None:
            duckdb = require("duckdb", "dataframe")
            self._duckdb = duckdb.connect()
            if self._fs.protocol not in ("file", ("file", "local")):
                self._duckdb.register_filesystem(self._fs)
        return self._duckdb

    # ------------------------------------------------------------------ files

    def _frame(self, table: str) -> pandas.DataFrame:
        pyarrow = require("pyarrow", "dataframe")
        pieces = self._read_pieces(table)
        if not pieces:
            return _empty(table).to_pandas()
        data = pyarrow.concat_tables(pieces, promote_options="permissive")
        # Key columns are written dictionary-encoded; a DataFrame gets plain strings.
        plain = pyarrow.schema(
            [
                field.with_type(field.type.value_type)
                if pyarrow.types.is_dictionary(field.type)
                else field
                for field in data.schema
            ],
            metadata=data.schema.metadata,
        )
        frame: pandas.DataFrame = data.cast(plain).to_pandas()
        return frame

    def _read_pieces(self, table: str) -> list[Any]:
        """Arrow tables of the table's files.

        A file that vanishes while being read was compacted meanwhile: list again rather than
        show fewer rows.
        """
        parquet = require("pyarrow.parquet", "dataframe")
        for _ in range(_RETRIES):
            pieces = []
            try:
                for path in self._readable(table):
                    with self._fs.open(path, "rb") as file:
                        pieces.append(parquet.read_table(file))
            except FileNotFoundError:
                continue
            return pieces
        raise RuntimeError(f"{self.path}: {table} kept changing while being read")

    def _readable(self, table: str) -> list[str]:
        """Paths of the table's files that can be read, damaged ones left out with a warning."""
        if table == "calls":
            path = self._join(CALLS_FILE)
            return [path] if self._fs.exists(path) else []
        parquet = require("pyarrow.parquet", "dataframe")
        directory = self._join(table)
        if not self._fs.exists(directory):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self._fs.ls(directory, detail=False)]
        readable = []
        for name in files_to_read(names):
            path = f"{directory}/{name}"
            try:
                with self._fs.open(path, "rb") as file:
                    parquet.read_metadata(file)
            except FileNotFoundError:
                raise  # compacted meanwhile: the caller lists again
            except Exception as error:  # any damage: truncated, garbage
                _warn_damaged(path, error)
                continue
            readable.append(path)
        return readable

    def _url(self, path: str) -> str:
        protocol = self._fs.protocol
        protocol = protocol[0] if isinstance(protocol, tuple) else protocol
        return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"

    def _join(self, relative: str) -> str:
        return f"{self._root.rstrip('/')}/{relative}"


def load(path: str | os.PathLike[str]) -> Run:
    """Open a run written by ``layerscope.watch(model, run=path)``, finished or not.

    Args:
        path: the run's directory, a local path or an fsspec URL.

    Returns:
        A ``Run``; its tables are read from disk at each access, so a run still being
        written shows more rows each time.

    Raises:
        FileNotFoundError: no run is there.
    """
    return Run(path)


def runs(root: str | os.PathLike[str]) -> pandas.DataFrame:
    """The runs directly under ``root``: name, path, status, steps, started, ended.

    Example::

        layerscope.runs("runs")
    """
    pandas = require("pandas", "dataframe")
    fsspec = require("fsspec", "dataframe")
    fs, base = fsspec.core.url_to_fs(os.fspath(root))
    rows = []
    for entry in sorted(fs.ls(base, detail=False)) if fs.exists(base) else []:
        if not fs.exists(f"{entry.rstrip('/')}/{RUN_FILE}"):
            continue
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        local = fs.protocol in ("file", ("file", "local"))
        location = entry if local else f"{os.fspath(root).rstrip('/')}/{name}"
        try:
            meta = Run(location).meta
        except (OSError, ValueError) as error:
            _warn_damaged(location, error)
            continue
        rows.append(
            {
                "name": meta.get("name"),
                "path": location,
                "status": meta.get("status"),
                "steps": meta.get("steps"),
                "started": pandas.to_datetime(meta.get("started"), unit="s"),
                "ended": pandas.to_datetime(meta.get("ended"), unit="s"),
            }
        )
    columns = ["name", "path", "status", "steps", "started", "ended"]
    return pandas.DataFrame(rows, columns=columns)


def _status(meta: dict[str, Any]) -> str:
    """The saved status, or ``"crashed"`` for a run marked running whose process is gone."""
    status = str(meta.get("status", "unknown"))
    if status != "running" or meta.get("host") != socket.gethostname():
        return status
    try:
        os.kill(int(meta["pid"]), 0)
    except ProcessLookupError:
        return "crashed"
    except (PermissionError, KeyError, TypeError, ValueError):
        pass
    return status


def _empty(table: str) -> Any:
    from layerscope.store._arrow import ALERTS_SCHEMA, CALLS_SCHEMA, SCALARS_SCHEMA

    pyarrow = require("pyarrow", "dataframe")
    schema = {"scalars": SCALARS_SCHEMA, "alerts": ALERTS_SCHEMA, "calls": CALLS_SCHEMA}.get(
        table, pyarrow.schema([("step", pyarrow.int64())])
    )
    return schema.empty_table()


def _warn_damaged(path: str, error: BaseException) -> None:
    warnings.warn(
        f"layerscope: skipped {path}, which cannot be read ({type(error).__name__}: {error})",
        LayerscopeWarning,
        stacklevel=4,
    )
