"""The worker processes behind ``watch(on_tensor=fn, workers=N)``.

``TensorWorkers.submit`` only appends a ``Record`` (a CPU copy) to a bounded queue; when the
queue is full the record is dropped and counted, so training never waits for the workers. A
monitor thread hands queued records to idle workers, reads back what each did, and replaces a
worker whose callback raised or that died.

Each worker has a pipe of its own rather than sharing one ``multiprocessing.Queue``: a worker
waiting on a shared queue holds its read lock, so one killed while idle (the OOM killer,
``kill -9``) would leave the lock taken and stall the others; and with its own pipe the parent
knows which record a dead worker held. A tensor travels as its raw bytes after a small
pickled header, written from its memory by the monitor thread and read straight into the
worker's buffer (no pickling of the tensor, and no torch shared memory, which a dead worker
could leak); the worker rebuilds the record around that buffer.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
import warnings
from collections import deque
from pathlib import Path
from typing import Any

from layerscope._errors import LayerscopeWarning
from layerscope.tensors._on_tensor import (
    OnTensor,
    callback_name,
    check_importable,
    check_on_tensor,
    check_workers,
    pickled,
)
from layerscope.tensors._records import Record
from layerscope.tensors._worker_handle import (
    TERMINATE_GRACE_S,
    Worker,
    stop_processes,
    value_bytes,
)
from layerscope.tensors._worker_monitor import FAILURES_TO_TURN_OFF, THREAD_NAME, WorkerMonitor

__all__ = ["FAILURES_TO_TURN_OFF", "TensorWorkers", "check_on_tensor"]


class TensorWorkers(WorkerMonitor):
    """Worker processes that run ``fn(record, directory)`` on submitted records.

    ``submit`` never waits: a record goes to a bounded queue, or is dropped and counted when
    the queue is full. A daemon monitor thread sends queued records to idle workers and
    replaces a worker whose callback raised (reported once as a ``LayerscopeWarning``) or
    that died; after ``FAILURES_TO_TURN_OFF`` failures in a row with no record processed in
    between, the pool turns itself off. Warnings are emitted by ``warn_pending()`` and
    ``close()``, on the caller's thread, never by ``submit``, which may run on a writer
    thread. A pool left open is closed at interpreter exit.

    With ``spawn`` (the default: forking a process that runs threads is unsafe), each worker
    imports torch (seconds) before it takes records; records submitted meanwhile wait in the
    queue. A worker imports the main module too, like any spawn pool, so a training script
    that defines ``fn`` must guard its training code with ``if __name__ == "__main__":``.

    Counters: every record given to ``submit`` is either ``submitted`` or ``dropped``; a
    submitted record ends ``processed`` (the callback returned), in ``errors`` (the callback
    raised, or its worker died while it held it), or ``abandoned`` (still queued or held when
    the pool turned off or ``close`` ran out of time).

    Args:
        fn: called as ``fn(record, directory)`` in a worker; must pickle by reference.
        workers: how many worker processes.
        directory: where ``fn`` writes its results, created by the worker if needed; None
            for a run in memory.
        queue_size: how many records wait for a worker at most (default ``2 * workers``).
        start_method: the ``multiprocessing`` start method.
        queue_bytes: how many bytes of values wait at most (None: no bound but the count);
            one record is always taken into an empty queue, however big.
    """

    def __init__(
        self,
        fn: OnTensor,
        workers: int,
        directory: Path | None,
        queue_size: int | None = None,
        start_method: str = "spawn",
        queue_bytes: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"fn: expected a callable fn(record, directory), got {type(fn).__name__}"
            )
        self._count = check_workers(workers)
        size = 2 * self._count if queue_size is None else queue_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"queue_size: expected an int >= 1, got {size!r}")
        # typeshed's BaseContext has no Process attribute; every real context has.
        self._context: Any = multiprocessing.get_context(start_method)
        if start_method != "fork":  # a forked worker has the parent's modules already
            check_importable(fn)
        self._fn_bytes = pickled(fn)
        self._name = callback_name(fn)
        self._directory = None if directory is None else Path(directory)
        if queue_bytes is not None and (
            isinstance(queue_bytes, bool) or not isinstance(queue_bytes, int) or queue_bytes < 1
        ):
            raise ValueError(f"queue_bytes: expected an int >= 1 or None, got {queue_bytes!r}")
        self._queue_size = size
        self._queue_bytes = queue_bytes
        self._lock = threading.Lock()
        self._pending: deque[Record] = deque()
        self._pending_bytes = 0
        self._workers: list[Worker] = []
        self._accepting = True  # False once closing or off
        self._closing = False
        self._aborting = False
        self._off = False
        self._closed: bool | None = None  # close()'s answer, once closed
        self._submitted = 0
        self._dropped = 0
        self._processed = 0
        self._errors = 0
        self._abandoned = 0
        self._skipped = 0
        self._skip_reasons: set[str] = set()  # each warned of once
        self._restarts = 0
        self._failures_in_row = 0
        self._first_failure: str | None = None
        self._due_warnings: list[str] = []
        # Wakes the monitor from its wait when a record arrives or close starts.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        try:
            for _ in range(self._count):
                self._start_worker()
        except BaseException:
            stop_processes(self._workers)
            self._close_wake_pipe()
            raise
        self._monitor = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._monitor.start()
        atexit.register(self.close)

    @property
    def submitted(self) -> int:
        """Records taken into the queue."""
        return self._submitted

    @property
    def dropped(self) -> int:
        """Records refused: the queue was full, or the pool closed or off."""
        return self._dropped

    @property
    def processed(self) -> int:
        """Records whose callback returned, as the workers reported."""
        return self._processed

    @property
    def errors(self) -> int:
        """Records whose callback raised, or whose worker died while it held them."""
        return self._errors

    @property
    def skipped(self) -> int:
        """Records the callback passed over (it raised ``SkippedTensorError``).

        Counted in ``processed`` too: their worker went on.
        """
        return self._skipped

    @property
    def abandoned(self) -> int:
        """Submitted records left unfinished when the pool turned off or close timed out."""
        return self._abandoned

    @property
    def restarts(self) -> int:
        """Workers started to replace one that failed."""
        return self._restarts

    @property
    def off(self) -> bool:
        """Whether the pool turned itself off after failures in a row."""
        return self._off

    def pids(self) -> list[int]:
        """Process ids of the workers the monitor knows as live."""
        with self._lock:
            return [worker.pid for worker in self._workers]

    def submit(self, record: Record) -> bool:
        """Queue ``record`` for a worker; never waits.

        Args:
            record: a record whose value is a tensor the caller no longer changes.

        Returns:
            True if queued; False (and counted in ``dropped``) when the queue is full or the
            pool is closed or off.
        """
        with self._lock:
            size = value_bytes(record)
            over_bytes = (
                self._queue_bytes is not None
                and self._pending  # one record always fits, however big
                and self._pending_bytes + size > self._queue_bytes
            )
            if not self._accepting or len(self._pending) >= self._queue_size or over_bytes:
                self._dropped += 1
                return False
            was_empty = not self._pending
            self._pending.append(record)
            self._pending_bytes += size
            self._submitted += 1
            # A monitor with records already queued is waiting for a worker to finish,
            # which wakes it too.
            if was_empty:
                self._wake()
        return True

    def warn_pending(self) -> None:
        """Emit the warnings due (the first failure, turning off), once each."""
        self._warn()

    def _warn(self) -> None:
        with self._lock:
            due, self._due_warnings = self._due_warnings, []
        for message in due:
            # At the caller of warn_pending() or close().
            warnings.warn(message, LayerscopeWarning, stacklevel=3)

    def close(self, timeout: float = 10.0) -> bool:
        """Let the workers finish the queued records, then stop them; idempotent.

        Args:
            timeout: seconds the workers get to finish; then they are terminated, and
                killed if they do not end.

        Returns:
            True if every queued record was finished and every worker ended on its own.
        """
        with self._lock:
            if self._closed is not None:
                return self._closed
            self._accepting = False
            self._closing = True
            self._wake()
        self._monitor.join(max(timeout, 0.0))
        finished = not self._monitor.is_alive()
        if not finished:
            with self._lock:
                self._aborting = True
                self._wake()
            self._monitor.join(TERMINATE_GRACE_S)
        with self._lock:
            left = list(self._workers)
        # Also unblocks a monitor stuck sending to a worker that stopped reading.
        stop_processes(left)
        self._monitor.join(TERMINATE_GRACE_S)
        if not self._monitor.is_alive():
            for worker in left:  # records they finished before they ended, not yet read
                self._read_messages(worker)
        with self._lock:
            unfinished = len(self._pending) + sum(w.holding is not None for w in left)
            self._abandoned += unfinished
            if unfinished and not self._off:
                self._due_warnings.append(
                    f"layerscope: on_tensor {self._name} had not finished {unfinished} "
                    f"queued tensors {timeout:g} s after the run closed; they were dropped "
                    f"(counted in scope.on_tensor_dropped). scope.close(timeout=...) waits "
                    f"longer"
                )
            self._pending.clear()
            self._pending_bytes = 0
            self._workers.clear()
            clean = finished and not self._off and not left
            self._closed = clean
            monitor_ended = not self._monitor.is_alive()
            if monitor_ended:  # else it may still read them: leave them open
                self._close_wake_pipe()
        if monitor_ended:
            for worker in left:
                worker.connection.close()
        atexit.unregister(self.close)
        self._warn()
        return clean
