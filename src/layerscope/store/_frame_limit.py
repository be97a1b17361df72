"""How many rows a run's table may hand over as one DataFrame, and the error past it.

A stats row in pandas, its histogram widened to 256 counts, takes about 3.5 KB: 51 million
rows would need 180 GB before any of them is looked at. Past ``max_frame_rows`` (counted from
the files' footers, before a row is read) a table is refused with the count and the ways to
ask DuckDB for what is wanted instead, which reads the files in bounded memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The rows a table hands over as one DataFrame by default: about 3.5 GB of stats rows.
MAX_FRAME_ROWS = 1_000_000
#: Memory a stats row takes in pandas, histogram widened (``benchmarks/scale.py``, 1 M rows).
_STATS_ROW_BYTES = 3_500


class FrameTooLargeError(MemoryError):
    """A table holds more rows than ``load(..., max_frame_rows=...)`` hands over as a DataFrame.

    Attributes:
        table: the table asked for (``"stats"``, ``"calls"``...).
        rows: how many rows it holds (at least: a merged table's count is bounded from below).
        limit: the ``max_frame_rows`` it is over.
    """

    def __init__(self, table: str, rows: int, limit: int, merged: bool = False) -> None:
        self.table, self.rows, self.limit = table, rows, limit
        what = f"at least {rows:,} merged" if merged else f"{rows:,}"
        size = ""
        if table == "stats":
            size = f" (about {_size(rows * _STATS_ROW_BYTES)} in pandas)"
        view = "merged_stats" if merged else table
        super().__init__(
            f"run.{table}: {what} rows, more than the "
            f"max_frame_rows={limit:,} handed over as one DataFrame{size}. Ask for the rows "
            f'you want: run.sql("select step, module, l2 from {view} where kind = ? and '
            f'module = ?", ["grad", name]); or load(path, max_frame_rows=None) to take '
            f"them all"
        )


def check_frame_rows(value: Any) -> int | None:
    """``max_frame_rows`` as given: a positive int, or None for no limit.

    Raises:
        TypeError, ValueError: it is something else, named.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"max_frame_rows: expected a positive int or None, got {type(value).__name__}"
        )
    if value < 1:
        raise ValueError(f"max_frame_rows: expected a positive int or None, got {value}")
    return value


def limit_frame(table: str, rows: int, limit: int | None, merged: bool = False) -> None:
    """Refuse ``table``'s ``rows`` if they are more than ``limit``.

    Raises:
        FrameTooLargeError: they are.
    """
    if limit is not None and rows > limit:
        raise FrameTooLargeError(table, rows, limit, merged)


def _size(octets: int) -> str:
    """``octets`` as a reader says them: ``"35.0 GB"``, ``"420 MB"``."""
    return f"{octets / 1e9:,.1f} GB" if octets >= 1e9 else f"{octets / 1e6:,.0f} MB"


def merged_within(
    stored: int, ranks: int, limit: int | None, merged: Callable[[int | None], Any]
) -> Any:
    """The merged rows ``merged(at_most)`` gives, once it is clear that they are ``limit`` at most.

    Args:
        stored: the rows the files hold, of ``ranks`` ranks; a merged row stands for at most
            one row of each rank, so a job's rows over ``limit`` times ``ranks`` are refused
            before any is merged.
        ranks: how many ranks wrote rows.
        limit: ``max_frame_rows``.
        merged: the merged rows, at most as many as it is given (None: all), as Arrow.

    Raises:
        FrameTooLargeError: they are more.
    """
    limit_frame("stats", stored // max(ranks, 1), limit, merged=True)
    if limit is None or stored <= limit:
        return merged(None)
    data = merged(limit + 1)
    limit_frame("stats", data.num_rows, limit, merged=True)
    return data
