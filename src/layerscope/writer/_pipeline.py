"""The writer thread: finishes flushes off the training thread and feeds the sinks.

The training thread only submits: a batch of readings whose device copy is under way, a list
of call events, a flush request. The writer flushes the sinks every ``flush_steps`` recorded
steps or ``flush_seconds`` seconds, whichever comes first, and until then lets batches wait:
it merges and finalises all of them at once, then writes them to the sinks. Most of its work
is a fixed cost per call, so this costs it several times less than a call per step, and it
leaves training alone between flushes instead of taking the GIL from it every step. The queue
is bounded: when the writer falls behind, a new batch is dropped (its rows are counted) rather
than blocking training.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from layerscope._errors import FailureCounter
from layerscope.distributed import ProcessRank
from layerscope.health import HealthMonitor
from layerscope.model import AttentionRow, Identities, StatsRows
from layerscope.recording import Batch, arrive, counted_histogram
from layerscope.sinks import FanOut, Records, RunSummary
from layerscope.stats import StatSelection
from layerscope.writer._attention import AttentionMerge
from layerscope.writer._merging import Merged, finalize_merged, merge_batches, split_merged
from layerscope.writer._rank_merge import RankMerge
from layerscope.writer._sentinel_rows import SentinelCarry, sentinel_rows

# Batches, and readings in them, that wait for the writer at most: a bound on the host memory
# they hold (a reading's row of partials and log2 histogram is 2 KB, 4 KB split by sign).
WAITING_BATCHES = 64
WAITING_READINGS = 8192


@dataclass(frozen=True, slots=True)
class _Flush:
    pass


@dataclass(frozen=True, slots=True)
class _Stop:
    # (recorded_rows, dropped_rows, dropped_scalars, writer_seconds) -> summary
    make_summary: Callable[[int, int, int, float], RunSummary]


class Pipeline:
    """A bounded queue and the thread that empties it into a sink."""

    def __init__(
        self,
        sink: FanOut,
        *,
        place: ProcessRank,
        selection: StatSelection,
        identities: Identities,
        failures: FailureCounter,
        flush_steps: int,
        flush_seconds: float,
        health: HealthMonitor | None = None,
        queue_size: int = 256,
        rank_merge: RankMerge | None = None,
    ) -> None:
        self.sink = sink
        # Read by the recorder (a BatchOutlet): the log2 histogram is counted split by sign.
        self.signed_histograms = sink.signed_histograms
        if rank_merge is not None:  # the rows it merges are the ones the recorder counts
            rank_merge.counted = counted_histogram(rank_merge.counted, self)
        self.rank_merge = rank_merge
        self.health = health
        self.recorded_rows = 0
        self.dropped_rows = 0  # of the stats table
        self.dropped_scalars = 0
        self._count_lock = threading.Lock()  # the training and the writer thread both count
        self._place = place
        self._selection = selection
        self._identities = identities
        self._failures = failures
        self._flush_steps = flush_steps
        self._flush_seconds = flush_seconds
        self._queue: queue.Queue[Batch | Records | _Flush | _Stop] = queue.Queue(queue_size)
        self._carry: Merged | None = None
        self._sentinel_carry: SentinelCarry | None = None
        self._attention = AttentionMerge()
        self._thread = threading.Thread(target=self._run, name="layerscope-writer", daemon=True)
        self._serial = threading.Event()
        threads = torch.get_num_threads()
        self._thread.start()
        self._serial.wait(timeout=30.0)
        # set_num_threads also sets the default of threads yet to come: give theirs back. This
        # thread's own count is what it was, and the writer's stays 1.
        torch.set_num_threads(threads)

    def submit(self, item: Batch | Records) -> None:
        """Queue a batch or records; drop them, counted, if the writer is too far behind.

        Where rows merge across ranks, wait instead: a rank that dropped a step would leave
        the collectives of the others waiting for it.
        """
        try:
            if self.rank_merge is not None:
                self._queue.put(item)
                return
            self._queue.put_nowait(item)
        except queue.Full:
            readings = len(item.readings) + len(item.extremes) if isinstance(item, Batch) else 0
            self.count_dropped(readings, len(item.scalars))
            self._failures.record("writing", RuntimeError("the writer fell behind"))

    def count_dropped(self, rows: int, scalars: int) -> None:
        """Count readings (rows of the stats table) and scalars lost on their way."""
        with self._count_lock:
            self.dropped_rows += rows
            self.dropped_scalars += scalars

    def log_alerts(self) -> None:
        """Log, on the calling (training) thread, the alerts the writer found since last time."""
        if self.health is not None:
            self.health.log_found()

    def drain(self) -> None:
        """Wait until everything submitted so far is written and flushed."""
        self._queue.put(_Flush())
        self._queue.join()

    def close(
        self,
        make_summary: Callable[[int, int, int, float], RunSummary],
        timeout: float | None = None,
    ) -> bool:
        """Write what is left, close the sink and stop the thread.

        Returns False if the thread has not finished within ``timeout`` seconds (a sink that
        hangs); it goes on as a daemon thread, and what it had not written is lost at exit.
        """
        try:
            self._queue.put(_Stop(make_summary), timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        # The writer's torch operations run on this thread alone. Were one of them parallel,
        # this thread would get an OpenMP team of its own, and two teams on the same cores
        # slow every parallel operation of training by up to 2x for as long as it lives.
        try:
            torch.get_num_threads()  # torch's lazy per-thread set-up first, or it undoes the next
            torch.set_num_threads(1)
        finally:
            self._serial.set()
        last_flush = time.monotonic()
        steps_since_flush = 0  # recorded steps, processed or waiting in ``waiting``
        waiting: list[Batch] = []
        waiting_readings = 0
        while True:
            wait = self._flush_seconds - (time.monotonic() - last_flush)
            try:
                item: Batch | Records | _Flush | _Stop | None = self._queue.get(
                    timeout=max(wait, 0.0)
                )
            except queue.Empty:
                item = None  # flush_seconds have passed
            try:
                due = item is None or time.monotonic() - last_flush >= self._flush_seconds
                if isinstance(item, Batch):
                    waiting.append(item)
                    waiting_readings += len(item.readings) + len(item.extremes)
                    steps_since_flush += item.final
                    due = due or steps_since_flush >= self._flush_steps
                elif isinstance(item, Records):
                    if item.calls and self.health is not None:
                        self.health.learn_calls(item.calls)
                    self._guarded("writing", self.sink.write, item)
                if self.rank_merge is not None:
                    # Every rank finishes the same steps at the same flushes, whatever the
                    # clock, readers or memory say: the collectives run in lockstep. The
                    # clock still flushes the sinks (the run's heartbeat).
                    ended = isinstance(item, Batch) and item.final
                    due = item is None or time.monotonic() - last_flush >= self._flush_seconds
                    if isinstance(item, _Stop) or (
                        ended and steps_since_flush >= self._flush_steps
                    ):
                        self._guarded("finalising a flush", self._process, waiting)
                        waiting, waiting_readings, steps_since_flush = [], 0, 0
                        due = True
                else:
                    full = len(waiting) >= WAITING_BATCHES or waiting_readings >= WAITING_READINGS
                    if waiting and (due or full or isinstance(item, _Flush | _Stop)):
                        self._guarded("finalising a flush", self._process, waiting)
                        waiting, waiting_readings = [], 0
                if isinstance(item, _Stop):
                    self._guarded("flushing", self.sink.flush)
                    summary = item.make_summary(
                        self.recorded_rows,
                        self.dropped_rows,
                        self.dropped_scalars,
                        time.thread_time(),
                    )
                    self._guarded("closing the run", self.sink.close, summary)
                    return
                if due or isinstance(item, _Flush):
                    self._guarded("flushing", self.sink.flush)
                    last_flush = time.monotonic()
                    if self.rank_merge is None:
                        steps_since_flush = 0
                if isinstance(item, _Flush):  # a reader waits for files
                    self._guarded("flushing", self.sink.sync)
            finally:
                if item is not None:
                    self._queue.task_done()

    def _process(self, batches: list[Batch]) -> None:
        """Merge, finalise and write waiting batches, oldest first."""
        if not batches:  # rows merge across ranks, and this one has none left: merge all the same
            self._write_done(self._across_ranks(None), [], None, [])
            return
        try:
            arrivals = [arrive(batch) for batch in batches]
            merged, scalars = merge_batches(batches, self._carry, arrivals)
            sentinel, self._sentinel_carry = sentinel_rows(
                batches,
                arrivals,
                self._place.rank,
                self._selection,
                self._identities,
                self._sentinel_carry,
            )
            self._attention.add(batches, arrivals)
        except Exception:
            self._carry = self._sentinel_carry = None
            self._attention.clear()
            self.count_dropped(
                sum(len(b.readings) + len(b.extremes) for b in batches),
                sum(len(b.scalars) for b in batches),
            )
            if self.rank_merge is not None:  # the other ranks wait for this one's part
                with contextlib.suppress(Exception):
                    self._write_done(self._across_ranks(None), [], None, [])
            raise
        # The last batch ends a step, or its step's readings wait for the next batch: those
        # of earlier steps are done. After an evaluation, its rows are done too, while the
        # step's training rows may still grow.
        last = batches[-1]
        done: Merged | None = merged
        self._carry = None
        if not last.final and merged is not None:
            done, self._carry = split_merged(
                merged, self._identities, last.open_steps, last.evaluated
            )
        attention = self._attention.take(
            last.final, last.open_steps, last.evaluated, self._place.rank
        )
        self._write_done(self._across_ranks(done), scalars, sentinel, attention)

    def _across_ranks(self, done: Merged | None) -> Merged | None:
        """``done`` merged with the other ranks' rows where asked to; as it is otherwise.

        A failed collective (a rank gone, a timeout) ends merging on this rank: its rows are
        its own from then on, and it no longer waits for the others.
        """
        if self.rank_merge is None:
            return done
        try:
            return self.rank_merge.merge(done)
        except Exception:
            self.rank_merge = None
            raise

    def _write_done(
        self,
        done: Merged | None,
        scalars: list[tuple[int, str, float]],
        sentinel: StatsRows | None,
        attention: list[AttentionRow],
    ) -> None:
        """Finalise ``done``, run the health rules on it, and write it with the rest."""
        stats = None
        if done is not None:
            stats = finalize_merged(done, self._place.rank, self._selection, self._identities)
            self.recorded_rows += len(stats)
        alerts = []
        if self.health is not None:
            chunks = [chunk for chunk in (stats, sentinel) if chunk is not None]
            try:
                alerts = self.health.observe(chunks, scalars, attention=attention)
            except Exception as error:  # the rows are written all the same
                self._failures.record("evaluating the health rules", error)
        # The recorded steps' rows first: a failure writing the sentinel's must not cost them.
        if stats is not None or scalars or alerts or attention:
            records = Records(stats=stats, scalars=scalars, alerts=alerts, attention=attention)
            self.sink.write(records)
        if sentinel is not None:
            self.recorded_rows += len(sentinel)
            self.sink.write(Records(stats=sentinel))

    def _guarded(self, where: str, action: Callable[..., None], *args: Any) -> None:
        # Nothing may escape: a dead writer would leave the training thread waiting forever.
        try:
            action(*args)
        except Exception as error:
            self._failures.record(where, error)
