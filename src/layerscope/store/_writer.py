"""ParquetStore: the run directory, written as a sink on layerscope's writer thread."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from layerscope._imports import require
from layerscope._limits import MAX_FLUSH_SECONDS, MAX_QUEUE_SIZE, MAX_STEP, Bound, check_within
from layerscope.model import CallEvent
from layerscope.sinks import Records, RunInfo, RunSummary
from layerscope.store._claim import PlaceClaim, check_own_directory
from layerscope.store._files import remove_if_empty
from layerscope.store._layout import SEGMENTED_TABLES
from layerscope.store._objects import make_directory
from layerscope.store._places import RankPlaces
from layerscope.store._run_meta import RunFile
from layerscope.store.locations import check_storage_options, location_filesystem


class ParquetStore(RankPlaces):
    """Writes a run directory that ``layerscope.load`` reads, also while it is being written.

    Rows gather in memory and are written as a Parquet segment per table every
    ``flush_steps`` recorded steps or ``flush_seconds`` seconds, whichever comes first. A
    segment becomes visible by an atomic rename, so a crash loses at most the rows since the
    last flush. ``close`` compacts each table into one file. An ``OSError`` (a full disk, a
    vanished directory) drops the rows of that flush, counts them in ``run.json`` and warns
    once; training goes on.

    A full disk must not cost ``run.json`` too: a run that ended well would read as crashed,
    its lost rows uncounted. So the store holds a reserve, a hidden ``.run.json.reserve`` of
    64 KiB (four times ``run.json`` if that is more) beside ``run.json`` (see
    ``_run_meta.RunFile``), made with the rank's files:

    - when ``run.json`` cannot be written, the reserve is removed and ``run.json`` written
      again in the space it freed;
    - rows are written only while the reserve is there: a flush with rows first makes it
      again if it was given up, and if there is no room for it yet, drops its rows (counted,
      one failure) without trying them, so that the freed space stays for ``run.json``. Once
      space is back, the reserve is made again and rows are written again;
    - ``close`` tries the last ``run.json`` five times over 1.5 s, and removes the reserve
      whatever happened (``discard`` too).

    So after a full disk, ``run.json`` still says how the run ended (``status``), every step
    trained (``steps``), the rows of the stats table given to the store (``recorded_rows``),
    those on disk (``written_rows``) and those lost (``dropped_rows``: recorded minus written,
    plus any the scope lost before they reached the store), the same for scalars, and the
    scope's ``failures`` (each flush that lost rows is one). ``stats_last_step``,
    ``scalars_last_step`` and ``alerts_last_step`` hold the last step of each table's rows on
    disk (null while it has none): after a full disk or a kill, the tables may end at
    different steps. While the run goes on, every ``run.json`` that can be written carries
    the store's own counts so far (its dropped rows and scalars, its failed flushes); at
    ``close`` the scope's are added.

    Every rank of a distributed job writes into the same directory: rank 0 at its root, rank
    ``r`` in ``rank-0000r/`` (see ``layerscope.store._layout``). ``start`` claims the rank's
    place and writes its ``run.json`` at once (see ``_places``): a second process starting a
    run there is refused then, and a place that cannot be written is said then. A process
    whose rank is not known yet (no process group, no ``RANK`` in the environment) starts as
    rank 0; if its first rows say otherwise, its files move to its rank's place. So the ranks
    of a job whose process group starts after ``watch()`` need their rank in the environment
    (as torchrun sets it). ``run.json`` is rewritten at every flush, also an idle one: its
    ``updated`` time is the heartbeat by which a reader on any host tells a run that died.

    On an object store (``s3://``, with s3fs) the run is written the same way, without
    folders or renames: each file is uploaded whole under its own name, and a writer's claim
    on its place is an object created only if absent (see ``_objects`` and ``_object_claim``).

    Args:
        path: the run's directory: a local path or an fsspec URL (``memory://``, ``s3://``...).
            It must not hold a run already.
        flush_steps: write a segment after this many recorded steps.
        flush_seconds: write a segment at least this often while rows wait.
        queue_size: how many flushes may wait for the writer thread; past that, new ones are
            dropped (and counted) rather than training slowed.
        name: the run's name; the directory's name by default.
        storage_options: options of the URL's filesystem, as fsspec takes them: for s3fs
            ``key``, ``secret``, ``client_kwargs={"endpoint_url": ...}``... They are never
            written into the run. ``layerscope.load(path, storage_options=...)`` reads it.

    Examples:
        >>> import torch, layerscope
        >>> model = torch.nn.Linear(2, 2)
        >>> store = layerscope.store.ParquetStore("memory://doc/run-a", flush_steps=1)
        >>> with layerscope.watch(model, every=1, run=store) as scope:
        ...     model(torch.ones(1, 2)).sum().backward()
        ...     scope.step(loss=0.25)
        >>> run = layerscope.load("memory://doc/run-a")
        >>> run.meta["status"], len(run.stats), run.scalars.value.tolist()
        ('finished', 6, [0.25])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_steps: int = 10,
        flush_seconds: float = 5.0,
        queue_size: int = 256,
        name: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"run: expected a path or URL, got {type(path).__name__}")
        if not os.fspath(path):
            raise ValueError("run: expected a path or URL, got an empty string")
        _check_count("flush_steps", flush_steps, MAX_STEP)
        if isinstance(flush_seconds, bool) or not isinstance(flush_seconds, int | float):
            raise TypeError(f"flush_seconds: expected a number of seconds, got {flush_seconds!r}")
        if not flush_seconds > 0:
            raise ValueError(f"flush_seconds: expected seconds > 0, got {flush_seconds!r}")
        check_within(flush_seconds, "flush_seconds", Bound(0, MAX_FLUSH_SECONDS))
        _check_count("queue_size", queue_size, MAX_QUEUE_SIZE)
        self.queue_size = queue_size
        self.storage_options = check_storage_options(storage_options)
        self.path = os.fspath(path)
        self.flush_steps = flush_steps
        self.flush_seconds = float(flush_seconds)
        self.name = name or self.path.rstrip("/").rsplit("/", 1)[-1]
        self.dropped_rows = 0  # rows of the stats table this store could not write
        self.dropped_scalars = 0  # scalars this store could not write
        self._pending: dict[str, list[Any]] = {table: [] for table in SEGMENTED_TABLES}
        self._pending_last: dict[str, int] = {}  # the last step of each table's pending rows
        self._calls: Any = None
        self._all_calls: list[CallEvent] = []
        self._segments: dict[str, int] = {}
        self._meta: dict[str, Any] = {}
        self._run_file: RunFile | None = None  # once the rank's files are made
        self._info: RunInfo | None = None
        self._place = ""  # this rank's directory, once its files are made
        self._claim = PlaceClaim()  # this writer's hold on its place
        self._settled = False  # whether the place is the rank's, the rank fixed
        self._first_segments: dict[str, int] = {}  # the first segment of each table it wrote
        self._made_root = False  # whether start made the run's directory
        self._discarded = False
        self._given_rows = 0  # rows of the stats table given to this store
        self._written_rows = 0
        self._written_scalars = 0
        self._written_alerts = 0
        self._failures = 0  # flushes whose files failed, for run.json until close
        self._steps = 0
        self._in_flight: threading.Thread | None = None
        self._file_error: Exception | None = None
        self._file_seconds = 0.0  # CPU time of the file threads, for run.json

    def __repr__(self) -> str:
        return f"ParquetStore({self.path!r})"

    # ------------------------------------------------------------------ the Sink protocol

    def start(self, info: RunInfo) -> None:
        """Claim the run's place and write its files: ``run.json`` says it runs from now on.

        The place is the rank's own if the rank is known already, the root otherwise (see
        ``_places``). Whatever fails leaves nothing behind.

        Raises:
            FileExistsError: a run is there already, another process is writing one there,
                the path is a file, or a directory holding files that are not a run's.
            OSError: the directory or the run's files cannot be written (a full disk).
        """
        require("pyarrow", "dataframe")
        # Its own filesystem object: a transaction on fsspec's shared one would hold writes back.
        self._fs, root = location_filesystem(
            self.path, fresh=True, storage_options=self.storage_options
        )
        self._root = root.rstrip("/")
        self._info = info
        known = info.place.peek()
        check_own_directory(self._fs, self._root, self.path)
        try:
            self._made_root = not self._fs.exists(self._root)
            make_directory(self._fs, self._root)
        except OSError as error:  # before training: better said now than dropped later
            raise OSError(f"run: cannot make the run directory {self.path}: {error}") from error
        try:
            # Unknown, the rank is taken for rank 0's until rows come (see _settle_rank).
            rank, world_size = info.place.fix() if known is not None else (0, 1)
            self._open_place(rank, world_size, reserve=True)
        except BaseException as error:
            if self._made_root:
                remove_if_empty(self._fs, self._root)
            if isinstance(error, OSError) and not isinstance(error, FileExistsError):
                # A full disk now would cost every row later: said before training starts.
                said = OSError(f"run: cannot write the run's files in {self.path}: {error}")
                said.errno = error.errno
                raise said from error
            raise
        self._settled = known is not None

    def discard(self) -> None:
        """Undo ``start`` (and what was written since): for a ``watch()`` that failed after it.

        Only this store's own files go; the run's directory goes too if this store made it
        and nothing else is in it now (another rank may have written there meanwhile). Call it
        once the writer thread has stopped; the store writes nothing afterwards.
        """
        if self._info is None or self._discarded:
            return
        self._discarded = True
        self._join_in_flight()
        self._pending = {table: [] for table in SEGMENTED_TABLES}
        self._pending_last = {}
        self._calls = None
        self._drop_place()
        if self._made_root:
            remove_if_empty(self._fs, self._root)

    def write(self, records: Records) -> None:
        """Convert the records to Arrow; they are written at the next flush."""
        from layerscope.store._arrow import (
            alerts_table,
            attention_table,
            calls_table,
            scalars_table,
            stats_table,
        )

        if self._discarded:
            return
        if records.stats is not None and len(records.stats):
            self._pending["stats"].append(stats_table(records.stats))
            self._given_rows += len(records.stats)
            self._steps = max(self._steps, self._last("stats", int(records.stats.step.max())) + 1)
        if records.scalars:
            self._pending["scalars"].append(scalars_table(records.scalars, self._rank()))
            last = self._last("scalars", max(step for step, _, _ in records.scalars))
            self._steps = max(self._steps, last + 1)
        if records.alerts:
            self._pending["alerts"].append(alerts_table(records.alerts, self._rank()))
            self._last("alerts", max(alert.step for alert in records.alerts))
        if records.attention:
            self._pending["attention"].append(attention_table(records.attention, self._rank()))
            self._last("attention", max(row.step for row in records.attention))
        if records.calls:
            # Every call order logged so far: calls.parquet is written whole again (a model
            # whose order changes often has few modules a step, or small orders).
            self._all_calls.extend(records.calls)
            self._calls = calls_table(self._all_calls, self._rank())

    def _last(self, table: str, step: int) -> int:
        """Keep ``step`` as the last of ``table``'s pending rows if it is later; return it."""
        self._pending_last[table] = max(step, self._pending_last.get(table, step))
        return step

    def flush(self) -> None:
        """Start writing one segment per table that has rows waiting, then ``run.json``.

        The files are written by a thread of their own, so that the next rows convert while
        these are compressed and written; one flush at a time is in flight. An error of a
        flush (an ``OSError`` of a full disk) is raised by the next ``flush``, ``sync`` or
        ``close``, its rows counted as dropped.

        The first flush with rows fixes the rank, and moves the files to its place if the
        run started as rank 0's without knowing (see ``_places``). If another process's run
        is there, that flush raises ``FileExistsError`` and its rows are dropped. A flush
        with nothing to write before then only renews ``run.json``: the rank stays unasked.
        """
        pyarrow = require("pyarrow", "dataframe")
        if self._discarded:
            return
        error = self._join_in_flight()
        tables = {}
        for table, pieces in self._pending.items():
            if pieces:
                self._pending[table] = []
                tables[table] = pyarrow.concat_tables(pieces, promote_options="permissive")
        # Counted once a table's segment is on disk, from its rows (not Arrow: pyarrow.compute
        # costs 9 MB of memory).
        last_steps = {table: self._pending_last.pop(table) for table in tables}
        calls, self._calls = self._calls, None
        if tables or calls is not None:
            try:
                self._settle_rank()
            except Exception:
                for table, data in tables.items():
                    self._count_dropped(table, data.num_rows)
                self._failures += 1
                raise
        if not self._place:  # its rank's place was taken: nothing to renew
            if error is not None:
                raise error
            return
        thread = threading.Thread(
            target=self._write_segments,
            args=(tables, last_steps, calls, self._steps),
            name="layerscope-files",
            daemon=True,  # the atexit close of a scope still flushes through it
        )
        thread.start()
        self._in_flight = thread
        if error is not None:
            raise error

    def _rank(self) -> int:
        assert self._info is not None, "start() first"
        return self._info.rank

    def sync(self) -> None:
        """Wait for the flush in flight; raise its error, if it had one."""
        error = self._join_in_flight()
        if error is not None:
            raise error

    def _join_in_flight(self) -> Exception | None:
        thread, self._in_flight = self._in_flight, None
        if thread is not None:
            thread.join()
        error, self._file_error = self._file_error, None
        return error

    def close(self, summary: RunSummary) -> None:
        """Write what waits, compact each table into one file and record how the run ended.

        A run that wrote no rows gets its rank's place now, if it started without knowing its
        rank; ``run.json`` says how it ended. An error of the last flush or of compaction is
        raised once ``run.json`` says so (it counts it in ``failures``, as the scope will).
        """
        if self._discarded:
            return
        late: Exception | None = None
        try:
            self.flush()
        except Exception as error:  # raised below, once run.json is written
            late = error
        finally:
            # Whatever flush raised, no segment may still be on its way when compaction starts.
            in_flight = self._join_in_flight()
            late = late or in_flight
            try:
                late = self._finish(summary, late)
            finally:
                self._release_reserve()
                self._claim.release()  # the run.json it leaves keeps the place
        if late is not None:
            raise late

    def _finish(self, summary: RunSummary, late: Exception | None) -> Exception | None:
        """Compact the tables and write the last ``run.json``; the error ``close`` raises."""
        self._settle_rank()  # raises where another run is: nothing of it is touched
        for table in SEGMENTED_TABLES:
            if not self._fs.exists(self._join(table)):
                continue  # a table this run does not keep
            # Compacting a long run takes a while: a heartbeat before each table, so that
            # no reader takes the run for a crashed one meanwhile.
            with contextlib.suppress(OSError):  # the last write below says what failed
                self._meta.update(updated=time.time())
                self._write_meta()
            try:
                self._compact(table)
            except Exception as error:  # its segments stay, as readable as before
                late = late or error
        self._meta.update(
            status=summary.status,
            ended=summary.ended,
            updated=time.time(),
            steps=max(self._steps, summary.steps),
            recorded_rows=summary.recorded_rows,
            written_rows=self._written_rows,
            dropped_rows=self.dropped_rows + summary.dropped_rows,
            written_scalars=self._written_scalars,
            dropped_scalars=self.dropped_scalars + summary.dropped_scalars,
            written_alerts=self._written_alerts,
            # The error this close raises is one more: the scope counts it once it is raised.
            failures=summary.failures + (0 if late is None else 1),
            cost_seconds=summary.cost_seconds,
            writer_seconds=summary.writer_seconds + self._file_seconds,
            kernel=summary.kernel,
        )
        assert self._run_file is not None, "opened above"
        self._run_file.write_last(self._meta)
        return late


def _check_count(name: str, value: object, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    check_within(value, name, Bound(1, most))
