"""A rank's files: a flush's segments and ``run.json``, written on the file thread.

``RankFiles`` holds what ``ParquetStore`` writes into its rank's directory and the counts it
keeps for ``run.json``; a flush hands its tables to ``_write_segments`` on a thread of its own.
While rows are written a reserve is held beside ``run.json`` (see ``_run_meta.RunFile``), so
that a full disk still leaves room to say how the run ended.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from layerscope.sinks import RunInfo
from layerscope.store._compaction import compact
from layerscope.store._files import file_names, write_parquet
from layerscope.store._layout import CALLS_FILE, segment_name
from layerscope.store._run_meta import RunFile, last_step_field


class RankFiles:
    """The files of one rank's place in a run directory, and their counts."""

    dropped_rows: int
    dropped_scalars: int
    _fs: Any
    _place: str
    _info: RunInfo | None
    _meta: dict[str, Any]
    _run_file: RunFile | None
    _segments: dict[str, int]
    _given_rows: int
    _written_rows: int
    _written_scalars: int
    _written_alerts: int
    _failures: int
    _file_error: Exception | None
    _file_seconds: float

    def _count_dropped(self, table: str, rows: int) -> None:
        if table == "stats":
            self.dropped_rows += rows
        elif table == "scalars":
            self.dropped_scalars += rows

    def _write_segments(
        self, tables: dict[str, Any], last_steps: dict[str, int], calls: Any, steps: int
    ) -> None:
        """Write each table's segment, then ``run.json``; a table that fails drops its rows."""
        started = time.thread_time()
        try:
            self._write_each(tables, last_steps, calls, steps)
        finally:
            self._file_seconds += time.thread_time() - started

    def _write_each(
        self, tables: dict[str, Any], last_steps: dict[str, int], calls: Any, steps: int
    ) -> None:
        error: Exception | None = None
        if tables or calls is not None:
            try:
                self._hold_reserve()
            except OSError as no_room:  # the disk is full still: its space is run.json's
                error = no_room
                for table, data in tables.items():
                    self._count_dropped(table, data.num_rows)
                tables, calls = {}, None
        for table, data in tables.items():
            index = self._segments[table]
            try:
                self._write_table(f"{table}/{segment_name(index)}", data)
            except Exception as failed:  # raised again by the next flush, on the writer thread
                self._count_dropped(table, data.num_rows)
                error = error or failed
                continue
            self._segments[table] = index + 1
            self._count_written(table, data.num_rows, last_steps[table])
        if calls is not None:
            try:
                self._write_table(CALLS_FILE, calls)
            except Exception as failed:
                error = error or failed
        if error is not None:
            self._failures += 1
        try:
            self._meta.update(
                updated=time.time(),
                steps=steps,
                recorded_rows=self._given_rows,
                written_rows=self._written_rows,
                dropped_rows=self.dropped_rows,
                written_scalars=self._written_scalars,
                dropped_scalars=self.dropped_scalars,
                written_alerts=self._written_alerts,
                failures=self._failures,
            )
            if self._info is not None and self._info.progress is not None:
                cost, kernel = self._info.progress()
                self._meta.update(cost_seconds=cost, kernel=kernel or None)
            self._write_meta()
        except Exception as failed:
            if error is None:
                self._failures += 1
                error = failed
        self._file_error = self._file_error or error

    def _count_written(self, table: str, rows: int, last_step: int) -> None:
        """Count a segment's rows as written, and the last step its table holds on disk."""
        if table == "stats":
            self._written_rows += rows
        elif table == "scalars":
            self._written_scalars += rows
        elif table == "alerts":
            self._written_alerts += rows
        field = last_step_field(table)
        held = self._meta[field]
        self._meta[field] = last_step if held is None else max(held, last_step)

    def _compact(self, table: str) -> None:
        """Merge a table's files into one (see ``_compaction``)."""
        compact(self._fs, self._join(table))

    def _write_table(self, relative: str, data: Any) -> None:
        """Write an Arrow table as one Parquet file, at ``relative`` in this rank's place."""
        write_parquet(self._fs, self._join(relative), [data], data.schema)

    def _write_meta(self) -> None:
        assert self._run_file is not None, "_open() first"
        self._run_file.write(self._meta)

    def _hold_reserve(self) -> None:
        assert self._run_file is not None, "_open() first"
        self._run_file.hold_reserve()

    def _release_reserve(self) -> None:
        if self._run_file is not None:
            with contextlib.suppress(OSError):  # nothing more to do about it
                self._run_file.release_reserve()

    def _list(self, table: str) -> list[str]:
        return file_names(self._fs, self._join(table))

    def _join(self, relative: str) -> str:
        """``relative`` in this rank's directory."""
        return f"{self._place}/{relative}"
