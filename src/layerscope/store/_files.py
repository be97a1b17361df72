"""A rank's files: written so that a reader sees each one whole or not at all, and removed.

On a disk every file goes to a hidden temporary name first and is renamed into place once
written, so a reader listing the directory never finds half a file. On an object store, which
renames nothing, the file is uploaded under its final name and appears once the upload
completes (see ``_objects``). Paths are names, never patterns: files are removed one by one by
their exact paths.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from layerscope._imports import require
from layerscope.model import KEY_COLUMNS
from layerscope.store._layout import (
    CALLS_FILE,
    MODULES_FILE,
    RUN_FILE,
    SCHEMA_VERSION,
    SEGMENTED_TABLES,
    segment_range,
)
from layerscope.store._objects import is_object_store, upload_whole

# Columns whose min and max let a query skip row groups: the stats table's keys, and the
# scalars' and calls' own.
_KEY_COLUMNS = frozenset((*KEY_COLUMNS, "name", "seq"))


def write_parquet(
    fs: Any, path: str, tables: Iterable[Any], schema: Any, *, row_group: int | None = None
) -> None:
    """Write Arrow tables of ``schema`` as one Parquet file at ``path``, atomically.

    Args:
        fs: the fsspec filesystem ``path`` is on.
        path: where the file goes.
        tables: the tables, in order; an iterator is read as the file is written.
        schema: their schema; each table is given its metadata.
        row_group: gather the tables into row groups of at least this many rows; None
            gathers them all into one write.
    """
    pyarrow = require("pyarrow", "dataframe")
    parquet = require("pyarrow.parquet", "dataframe")
    # The file's own name: a reader knows a copy under another name for what it is.
    metadata = {
        b"layerscope.schema": str(SCHEMA_VERSION).encode(),
        b"layerscope.file": path.rpartition("/")[2].encode(),
    }
    schema = schema.with_metadata({**(schema.metadata or {}), **metadata})
    strings = [f.name for f in schema if _is_string(f.type)]

    def write(file: Any) -> None:
        with parquet.ParquetWriter(
            file,
            schema,
            compression="lz4",
            use_dictionary=strings or False,
            # Min and max help queries skip row groups by key; on statistics and
            # histograms they only cost time.
            write_statistics=[f.name for f in schema if f.name in _KEY_COLUMNS],
        ) as writer:
            waiting: list[Any] = []
            rows = 0
            for piece in tables:
                waiting.append(piece.replace_schema_metadata(schema.metadata))
                rows += piece.num_rows
                if row_group is not None and rows >= row_group:
                    writer.write_table(pyarrow.concat_tables(waiting))
                    waiting, rows = [], 0
            if waiting:
                writer.write_table(pyarrow.concat_tables(waiting))

    atomic_write(fs, path, write)


def write_bytes(fs: Any, path: str, payload: bytes) -> None:
    """Write ``payload`` as the file at ``path``, atomically."""
    atomic_write(fs, path, lambda file: file.write(payload))


def atomic_write(fs: Any, path: str, write: Callable[[Any], object]) -> None:
    """Write to a hidden temporary name, then rename: readers see all of it or nothing.

    On an object store, the upload of the file under its own name is what is atomic.

    Args:
        fs: the fsspec filesystem ``path`` is on.
        path: where the file goes.
        write: writes the contents into the binary file object it is given.
    """
    if is_object_store(fs):
        upload_whole(fs, path, write)
        return
    directory, _, name = path.rpartition("/")
    temporary = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        # Written now, whatever transaction the filesystem object is in: it is renamed next.
        with fs.open(temporary, "wb", autocommit=True) as file:
            write(file)
        fs.mv(temporary, path)
    except BaseException:
        if fs.exists(temporary):
            fs.rm(temporary)
        raise


def remove_file(fs: Any, path: str) -> None:
    """Remove the file at exactly ``path`` (``fs.rm`` takes ``exp[1]`` for a pattern on some)."""
    fs.rm_file(path)


def file_names(fs: Any, directory: str) -> list[str]:
    """The names (not paths) of what ``directory`` holds.

    On an object store a folder that holds nothing does not exist: it has no names.
    """
    try:
        listed = fs.ls(directory, detail=False)
    except FileNotFoundError:
        if is_object_store(fs):
            return []
        raise
    return [path.rstrip("/").rsplit("/", 1)[-1] for path in listed]


def remove_written(fs: Any, place: str, first_segments: dict[str, int]) -> None:
    """Remove what one writer wrote in a rank's ``place``, and the table directories left empty.

    Args:
        fs: the fsspec filesystem the run is on.
        place: the rank's directory.
        first_segments: the first segment the writer wrote of each table; earlier ones, of
            another writer, stay.
    """
    for name in (RUN_FILE, MODULES_FILE, CALLS_FILE):
        if fs.exists(f"{place}/{name}"):
            remove_file(fs, f"{place}/{name}")
    for table in SEGMENTED_TABLES:
        if not fs.exists(f"{place}/{table}"):  # a table the run does not keep (attention)
            continue
        for name in file_names(fs, f"{place}/{table}"):
            span = segment_range(name)
            if span is not None and span[0] >= first_segments[table]:
                remove_file(fs, f"{place}/{table}/{name}")
        remove_if_empty(fs, f"{place}/{table}")


def remove_if_empty(fs: Any, directory: str) -> None:
    """Remove ``directory`` if it exists and holds nothing; leave it otherwise.

    On an object store a folder goes with its last file, and what looks like an empty one is
    a bucket: nothing is removed there.
    """
    if is_object_store(fs):
        return
    try:
        if fs.exists(directory) and not fs.ls(directory, detail=False):
            fs.rmdir(directory)
    except OSError:  # something appeared meanwhile, or it went: either way, not ours to take
        pass


def _is_string(kind: Any) -> bool:
    """A string column, plain or dictionary-encoded."""
    pyarrow = require("pyarrow", "dataframe")
    if pyarrow.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pyarrow.types.is_string(kind))
