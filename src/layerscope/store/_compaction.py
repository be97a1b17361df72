"""Compaction: the segments of a table merged into one file when a run closes.

The merged file is written first and the segments deleted afterwards; a reader skips the
segments a compacted file covers (see ``_layout``), so a crash between the two steps never
shows a row twice. On an object store the merged file appears once its upload completes (see
``_objects``), and the order is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from layerscope._imports import require
from layerscope.store._files import file_names, remove_file, write_parquet
from layerscope.store._layout import compacted_name, files_to_read, segment_range

# Rows of a row group of a compacted file: compaction holds fewer than twice as many at once
# (under 1 KB each while it does). Smaller groups cost queries time: one module's series out
# of a million rows written in segments of 2,400 took 25 ms with these, 61 ms with 2,048.
COMPACTED_ROW_GROUP = 1 << 13


def compact(fs: Any, directory: str) -> None:
    """Merge the files of the table in ``directory`` into one; the segments go once it is in.

    Segments are read a row group's worth at a time, and written a row group at a time,
    so that closing a long run does not hold all of it, or all of a large segment, at once.

    Args:
        fs: the fsspec filesystem the run is on.
        directory: the table's directory in one rank's place (``RUN/stats``...).
    """
    pyarrow = require("pyarrow", "dataframe")
    parquet = require("pyarrow.parquet", "dataframe")
    names = files_to_read(file_names(fs, directory))
    if len(names) < 2:
        return
    spans = [segment_range(name) for name in names]
    first, last = spans[0][0], spans[-1][1]  # type: ignore[index]  # files_to_read keeps table files only
    paths = [f"{directory}/{name}" for name in names]
    # ParquetFile, not read_table: that imports pyarrow.dataset, and with it pandas.
    schemas = []
    for path in paths:
        with fs.open(path, "rb") as file:
            schemas.append(parquet.ParquetFile(file).schema_arrow)
    schema = pyarrow.unify_schemas(schemas, promote_options="permissive")

    def pieces() -> Iterator[Any]:
        for path in paths:
            with fs.open(path, "rb") as file:
                # A segment may be large (a flush of many steps of a large model): read it
                # a row group's worth at a time.
                batches = parquet.ParquetFile(file).iter_batches(
                    batch_size=COMPACTED_ROW_GROUP, use_threads=False
                )
                for batch in batches:
                    yield _conform(pyarrow.Table.from_batches([batch]), schema)

    merged = f"{directory}/{compacted_name(first, last)}"
    write_parquet(fs, merged, pieces(), schema, row_group=COMPACTED_ROW_GROUP)
    for path in paths:
        remove_file(fs, path)


def _conform(table: Any, schema: Any) -> Any:
    """``table`` with the columns of ``schema``, in its order: missing ones null, types cast."""
    pyarrow = require("pyarrow", "dataframe")
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pyarrow.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pyarrow.Table.from_arrays(columns, schema=schema)
