"""Which of a run's Parquet files a reader may read: whole, of this table, of this rank, once.

A file is checked once, from its footer, and never changes after (files appear by rename and
are never rewritten). It is left out, with its reason, when it is:
- damaged: truncated, garbage, not Parquet, not a regular file (a FIFO, a device), or
  claiming more rows than its size can hold;
- another table's or another program's: a key column missing or of another type;
- a copy: its footer names another file (``layerscope.file``, written since schema 1's
  files carried it), or its footer is byte for byte another file's;
- another rank's: its ``rank`` column, by the footer's statistics, is not its directory's.
A table whose files hold fewer rows than the rank's ``run.json`` counts as written is named
too: its files were removed or replaced.

Damage past the footer, in the pages, shows only when they are read: a reader that meets it
leaves the file out then (``reject``), and it stays out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from layerscope._imports import require
from layerscope.stats import BUILTIN_STATS
from layerscope.store._damage import RunFileError
from layerscope.store._regular_files import open_regular

# The columns a table's file must have, and the kind of each column a reader relies on.
_REQUIRED = {
    "stats": ("step", "phase", "module", "kind", "tensor", "call"),
    "scalars": ("step", "name", "value"),
    "alerts": ("step", "rule", "module", "severity", "message"),
    "calls": ("seq", "event", "module"),
    "attention": ("step", "phase", "module", "call", "head", "entropy_mean"),
}
_KINDS = {
    "step": "integer",
    "rank": "integer",
    "call": "integer",
    "seq": "integer",
    "numel": "integer",
    "hist_lo": "integer",
    "nan_count": "integer",
    "inf_count": "integer",
    "phase": "string",
    "module": "string",
    "module_type": "string",
    "kind": "string",
    "tensor": "string",
    "name": "string",
    "rule": "string",
    "severity": "string",
    "message": "string",
    "event": "string",
    "dtype": "string",
    "sentinel": "boolean",
    "value": "number",
    "threshold": "number",
    "hist": "list",
    "head": "integer",
    "keys": "integer",
    "entropy_mean": "number",
    "entropy_min": "number",
    "entropy_frac": "number",
    "max_prob": "number",
    **{stat: "number" for stat in BUILTIN_STATS if stat not in ("hist",)},
}
# What run.json counts of each table's rows: a table holding fewer lost some.
_WRITTEN_COUNT = {"stats": "written_rows", "scalars": "written_scalars"}
_FOOTER_TAIL = 8  # a Parquet file ends with its footer's length (4 bytes) and "PAR1"
# The most rows a file may claim per byte of its size. Every table stores an 8-byte integer
# column (``step``, or ``seq``) plainly: the densest files measured, every row alike, hold
# 13.5 rows a byte with lz4 (what layerscope writes) and 76 with zstd. A footer claiming more
# (2**62 rows) would have a reader allocate room for rows that are not there.
_ROWS_PER_BYTE = 1024


@dataclass
class Listing:
    """The files of one table of one rank to read, and those left out with their reasons."""

    paths: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    rankless: set[str] = field(default_factory=set)


@dataclass
class _Verdict:
    reason: str | None
    rows: int = 0
    rankless: bool = False
    fingerprint: bytes = b""


class SegmentChecks:
    """The checks of one run's files, each file's verdict kept.

    Args:
        fs: the fsspec filesystem of the run.
        places: each rank's directory -> (rank, its checked ``run.json``).
        outside: whether a path lies outside the folder the run may be read within.
    """

    def __init__(
        self,
        fs: Any,
        places: dict[str, tuple[int, dict[str, Any]]],
        outside: Callable[[str], bool] = lambda path: False,
    ) -> None:
        self._fs = fs
        self._places = places
        self._outside = outside
        self._verdicts: dict[str, _Verdict] = {}
        self._owners: dict[bytes, str] = {}  # footer fingerprint -> the first file with it

    def has_meta(self, place: str) -> bool:
        """Whether ``place`` has a ``run.json`` that was read: its files may be read."""
        return place in self._places

    def listing(self, place: str, table: str, directory: str, names: list[str]) -> Listing:
        """Which of ``names`` (in ``directory``, of ``place``'s rank) to read, in order.

        Raises:
            FileNotFoundError: a listed file vanished (compacted meanwhile): list again.
        """
        listing = Listing()
        rows = 0
        rank = self._places.get(place, (None, {}))[0]
        for name in names:
            path = f"{directory}/{name}"
            verdict = self._verdicts.get(path)
            if verdict is None:
                verdict = self._check(path, name, table, rank)
                self._verdicts[path] = verdict
            if verdict.reason is None:
                owner = self._owners.setdefault(verdict.fingerprint, path)
                if owner != path:
                    verdict.reason = f"a copy of {owner}: the same rows twice"
            if verdict.reason is not None:
                listing.skipped.append((path, verdict.reason))
                continue
            rows += verdict.rows
            listing.paths.append(path)
            if verdict.rankless:
                listing.rankless.add(path)
        lost = _lost_rows(self._places.get(place, (None, {}))[1], table, rows)
        if lost is not None:
            held = "its files hold" if names else "there is no file: it holds"
            listing.skipped.append((directory, f"{held} {rows} rows {lost}"))
        return listing

    def rows(self, paths: list[str]) -> int:
        """How many rows the footers of ``paths``, files listed to read, say they hold."""
        return sum(self._verdicts[path].rows for path in paths if path in self._verdicts)

    def reject(self, path: str, reason: str) -> None:
        """Leave ``path`` out from now on, for ``reason``: its pages could not be read."""
        self._verdicts.setdefault(path, _Verdict(reason)).reason = reason

    def _check(self, path: str, name: str, table: str, rank: int | None) -> _Verdict:
        parquet = require("pyarrow.parquet", "dataframe")
        if self._outside(path):
            return _Verdict("a link to a place outside the served folder: not read")
        try:
            with open_regular(self._fs, path) as file:
                file.seek(0, 2)
                size = file.tell()
                file.seek(max(0, size - _FOOTER_TAIL))
                tail = file.read(_FOOTER_TAIL)
                footer_size = int.from_bytes(tail[:4], "little") if len(tail) == 8 else 0
                file.seek(max(0, size - _FOOTER_TAIL - footer_size))
                footer = file.read(footer_size)
                file.seek(0)
                metadata = parquet.read_metadata(file)
        except FileNotFoundError:
            raise  # compacted meanwhile: the caller lists again
        except RunFileError as error:  # a FIFO, a device, a folder
            return _Verdict(error.reason)
        except Exception as error:  # any damage: truncated, garbage
            return _Verdict(f"{type(error).__name__}: {error}")
        schema = metadata.schema.to_arrow_schema()
        reason = _rows_fault(metadata, size) or _schema_fault(schema, table)
        if reason is None:
            reason = _name_fault(schema.metadata or {}, name)
        if reason is None and rank is not None:
            reason = _rank_fault(metadata, rank)
        fingerprint = hashlib.blake2b(footer + size.to_bytes(8, "little")).digest()
        return _Verdict(
            reason,
            rows=metadata.num_rows,
            rankless="rank" not in schema.names,
            fingerprint=fingerprint,
        )


def _lost_rows(meta: dict[str, Any], table: str, rows: int) -> str | None:
    """What ``run.json`` says of ``table`` that ``rows`` rows on disk belie, or None."""
    counted = meta.get(_WRITTEN_COUNT.get(table, ""))
    if isinstance(counted, int) and rows < counted:
        return f"where run.json counts {counted} written: files were removed or replaced"
    last = meta.get(f"{table}_last_step")
    if table == "alerts" and isinstance(last, int) and rows == 0:
        # run.json counts no alerts, but says which step the last one on disk is
        return f"where run.json says they reach step {last}: files were removed or replaced"
    return None


def _rows_fault(metadata: Any, size: int) -> str | None:
    """Why a file of ``size`` bytes cannot hold the rows its footer claims, or None."""
    groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    rows = metadata.num_rows
    if rows < 0 or min(groups, default=0) < 0 or sum(groups) != rows:
        return f"its footer claims {rows} rows, its row groups {sum(groups)}"
    if rows > _ROWS_PER_BYTE * size:
        return f"its footer claims {rows} rows, more than {size} bytes can hold"
    return None


def _schema_fault(schema: Any, table: str) -> str | None:
    """Why a file of ``schema`` is not one of ``table``'s, or None."""
    pyarrow = require("pyarrow", "dataframe")
    missing = [name for name in _REQUIRED[table] if name not in schema.names]
    if missing:
        return f"not a {table} file of layerscope: no column {', '.join(missing)}"
    for column in schema:
        kind = column.type
        if pyarrow.types.is_dictionary(kind):
            kind = kind.value_type
        expected = _KINDS.get(column.name)
        if expected is not None and not _is_kind(pyarrow, kind, expected):
            return f"column {column.name} is {kind}, expected {expected}"
    return None


def _is_kind(pyarrow: Any, kind: Any, expected: str) -> bool:
    types = pyarrow.types
    if expected == "integer":
        return bool(types.is_integer(kind))
    if expected == "string":
        return bool(types.is_string(kind) or types.is_large_string(kind))
    if expected == "boolean":
        return bool(types.is_boolean(kind))
    if expected == "number":
        return bool(types.is_integer(kind) or types.is_floating(kind) or types.is_null(kind))
    return bool(types.is_list(kind) or types.is_large_list(kind))


def _name_fault(metadata: dict[bytes, bytes], name: str) -> str | None:
    """Why a file named ``name`` is a copy, by the name its footer gives, or None."""
    written = metadata.get(b"layerscope.file")
    if written is not None and written.decode("utf-8", "replace") != name:
        return f"a copy of {written.decode('utf-8', 'replace')}: written under that name"
    return None


def _rank_fault(metadata: Any, rank: int) -> str | None:
    """Why a file's rows are not of ``rank`` (by its footer's statistics), or None."""
    leaves = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    if "rank" not in leaves:
        return None  # written before tables had a rank: rank 0's, wherever they are
    column = leaves.index("rank")
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(column).statistics
        if statistics is None or not statistics.has_min_max:
            continue
        if statistics.min != rank or statistics.max != rank:
            return f"holds rows of rank {statistics.min} to {statistics.max}, not of rank {rank}"
    return None
