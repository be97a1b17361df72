"""A table of a run read whole: its files' Arrow tables, joined into one DataFrame.

Each file is read with its ``rank`` (files written before tables had one get rank 0); a table
no file holds yet is an empty one with the table's columns, as ``run.json``'s config says. A
file that cannot be read whole (damaged pages behind a sound footer) is left out, and the
rest read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from layerscope._imports import require
from layerscope.store._damage import RunFileError
from layerscope.store._regular_files import open_regular

if TYPE_CHECKING:
    pass

#: How many times a table is listed again when a file vanishes as it is read.
RETRIES = 10
#: Why a file whose footer is sound is left out when its rows cannot be read.
UNREADABLE_DATA = "its footer is sound but its data cannot be read"


def plain_table(pieces: list[Any], empty: Any) -> Any:
    """One Arrow table of ``pieces``, with every column of ``empty``'s, strings plain."""
    pyarrow = require("pyarrow", "dataframe")
    if not pieces:
        data = empty
    else:
        data = pyarrow.concat_tables(pieces, promote_options="permissive")
        for field in empty.schema:  # columns no file has: a run of sentinel rows only
            if field.name not in data.column_names:
                data = data.append_column(field, pyarrow.nulls(data.num_rows, field.type))
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
    return data.cast(plain)


def read_pieces(
    fs: Any,
    readable: Callable[[], list[str]],
    what: str,
    damaged: Callable[[str, str], object] = lambda path, reason: None,
    listed: list[str] | None = None,
) -> list[Any]:
    """Arrow tables of the files ``readable()`` lists, each with its ``rank``.

    A file that vanishes while being read was compacted meanwhile: list again rather than
    show fewer rows.

    Args:
        fs: the fsspec filesystem.
        readable: lists the table's files to read, now.
        what: the run and table, for the error when they never stop changing.
        damaged: told each file that cannot be read, and why; the file is left out.
        listed: the files to read first, as listed already; listed again if one vanished.
    """
    pyarrow = require("pyarrow", "dataframe")
    parquet = require("pyarrow.parquet", "dataframe")
    for _ in range(RETRIES):
        pieces = []
        try:
            paths, listed = (readable() if listed is None else listed), None
            for path in paths:
                try:
                    with open_regular(fs, path) as file:
                        piece = parquet.read_table(file)
                except FileNotFoundError:
                    raise
                except RunFileError as error:  # no longer a regular file
                    damaged(path, error.reason)
                    continue
                except Exception as error:  # the pages behind a sound footer: any damage
                    damaged(path, f"{UNREADABLE_DATA} ({type(error).__name__}: {error})")
                    continue
                if "rank" not in piece.column_names:  # written before tables had one
                    rank = pyarrow.array([0] * piece.num_rows, pyarrow.int32())
                    piece = piece.append_column("rank", rank)
                pieces.append(piece)
        except FileNotFoundError:
            continue
        return pieces
    raise RuntimeError(f"{what} kept changing while being read")


def empty_table(table: str, meta: dict[str, Any]) -> Any:
    """An empty Arrow table with ``table``'s columns, for a run whose ``run.json`` is ``meta``."""
    from layerscope.store._arrow import (
        ALERTS_SCHEMA,
        ATTENTION_SCHEMA,
        CALLS_SCHEMA,
        SCALARS_SCHEMA,
        stats_schema,
    )

    if table == "stats":
        config = meta.get("config", {})
        schema = stats_schema(
            config.get("stats", ()),
            config.get("custom_stats", ()),
            histogram=bool(meta.get("histogram_edges")),
        )
    else:
        schema = {
            "scalars": SCALARS_SCHEMA,
            "alerts": ALERTS_SCHEMA,
            "attention": ATTENTION_SCHEMA,
        }.get(table, CALLS_SCHEMA)
    return schema.empty_table()
