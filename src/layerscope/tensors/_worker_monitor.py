"""The pool's monitor thread: it feeds idle workers, reads what they did, replaces the dead.

``WorkerMonitor`` holds the state a ``TensorWorkers`` pool shares with its monitor thread, all
of it under ``_lock``, and the thread's loop; the pool's face (``submit``, ``close``, its
counters) is ``_workers.TensorWorkers``, which builds on it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections import deque
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from layerscope.tensors._records import Record
from layerscope.tensors._worker_handle import (
    TERMINATE_GRACE_S,
    Worker,
    encode_header,
    exit_description,
    send_encoded,
    send_stop,
    start_worker,
    stop_processes,
    value_bytes,
)

# Failures in a row, with no tensor processed in between, that turn the pool off.
FAILURES_TO_TURN_OFF = 3
THREAD_NAME = "layerscope-on_tensor"


class WorkerMonitor:
    """The shared state of a worker pool and its monitor thread's loop."""

    _context: Any
    _fn_bytes: bytes
    _name: str
    _directory: Path | None
    _lock: threading.Lock
    _pending: deque[Record]
    _pending_bytes: int
    _workers: list[Worker]
    _accepting: bool
    _closing: bool
    _aborting: bool
    _off: bool
    _processed: int
    _errors: int
    _abandoned: int
    _skipped: int
    _skip_reasons: set[str]
    _restarts: int
    _failures_in_row: int
    _first_failure: str | None
    _due_warnings: list[str]
    _wake_read: int
    _wake_write: int

    def _wake(self) -> None:
        # Under the lock: close() closes the pipe under it too, so the fd is still ours.
        with contextlib.suppress(BlockingIOError):  # full of wake-ups already
            os.write(self._wake_write, b"\0")

    def _close_wake_pipe(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_read = self._wake_write = -1

    def _start_worker(self) -> None:
        worker = start_worker(
            self._context, self._fn_bytes, self._directory, f"{THREAD_NAME}-worker"
        )
        with self._lock:
            late = self._aborting  # close() gave up meanwhile and took its list of workers
            if not late:
                self._workers.append(worker)
        if late:
            stop_processes([worker])
            worker.connection.close()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # the monitor must never take training down
            with self._lock:
                self._note_failure(
                    f"the on_tensor monitor thread failed ({type(error).__name__}: {error})",
                    traceback.format_exc(),
                )
                self._turn_off("its monitor thread failed")
                left = list(self._workers)
            stop_processes(left)

    def _serve(self) -> None:
        left: list[Worker] = []
        while True:
            sends: list[tuple[Worker, Record | None]] = []
            with self._lock:
                if self._off:
                    left, self._workers = self._workers, []
                if self._aborting or self._off or (self._closing and not self._workers):
                    break
                for worker in self._workers:
                    busy = worker.holding is not None or worker.stopping
                    if not worker.ready or busy or worker.reported:  # reported: it exits
                        continue
                    if self._pending:
                        taken = self._pending.popleft()
                        self._pending_bytes -= value_bytes(taken)
                        worker.holding = repr(taken)
                        sends.append((worker, taken))
                    elif self._closing:
                        worker.stopping = True
                        sends.append((worker, None))
                if self._closing and not self._pending:
                    # A worker still starting holds nothing: no need to wait for it.
                    starting = [w for w in self._workers if not w.ready and not w.stopping]
                    for worker in starting:
                        worker.stopping = True
                else:
                    starting = []
            for worker in starting:
                worker.process.terminate()
            for worker, record in sends:
                self._send(worker, record)
            self._wait_and_handle()
        if self._off:
            stop_processes(left)
            for worker in left:
                worker.connection.close()

    def _send(self, worker: Worker, record: Record | None) -> None:
        if record is None:
            send_stop(worker)
            return
        try:
            pickled, value, data = encode_header(record)
        except Exception as error:
            with self._lock:
                worker.holding = None
                self._errors += 1
                self._note_failure(
                    f"a record could not be sent to on_tensor {self._name} "
                    f"({type(error).__name__}: {error})",
                    traceback.format_exc(),
                )
            return
        try:
            send_encoded(worker, pickled, data)
        finally:
            del value, data  # the view must not outlive the tensor it reads

    def _wait_and_handle(self) -> None:
        with self._lock:
            workers = list(self._workers)
        messages = {w.connection: w for w in workers if not w.eof}
        exits = {w.process.sentinel: w for w in workers}
        ready = wait([self._wake_read, *messages, *exits], timeout=1.0)
        if self._wake_read in ready:
            os.read(self._wake_read, 4096)
        # Messages first: a worker that reported its error and then exited did both.
        for item in ready:
            if isinstance(item, Connection) and item in messages:
                self._read_messages(messages[item])
        for item in ready:
            if isinstance(item, int) and item in exits:
                self._on_exit(exits[item])

    def _read_messages(self, worker: Worker) -> None:
        while not worker.eof:
            try:
                if not worker.connection.poll():
                    return
                message = worker.connection.recv()
            except (EOFError, OSError):
                worker.eof = True
                return
            self._on_message(worker, message)

    def _on_message(self, worker: Worker, message: tuple[Any, ...]) -> None:
        with self._lock:
            kind = message[0]
            if kind == "ready":
                worker.ready = True
            elif kind == "done":
                worker.holding = None
                self._processed += 1
                self._failures_in_row = 0
                if len(message) > 1:  # the callback passed the record over: SkippedTensorError
                    self._skipped += 1
                    if message[1] not in self._skip_reasons:
                        self._skip_reasons.add(message[1])
                        self._due_warnings.append(
                            f"layerscope: on_tensor {self._name} skipped a tensor: {message[1]}; "
                            "the other tensors go on"
                        )
            elif kind == "failed":
                _, type_name, text, trace = message
                where = "" if worker.holding is None else f" on {worker.holding}"
                if worker.holding is not None:
                    self._errors += 1
                else:
                    where = " while the worker started"
                worker.holding = None
                worker.reported = True
                self._note_failure(
                    f"on_tensor {self._name} raised {type_name}: {text}{where} "
                    f"(worker pid {worker.pid})",
                    trace,
                )

    def _on_exit(self, worker: Worker) -> None:
        self._read_messages(worker)  # what it sent before it ended
        worker.process.join(TERMINATE_GRACE_S)
        code = worker.process.exitcode
        if code is not None:
            worker.process.close()  # its sentinel's pipe now, not when it is collected
        worker.connection.close()
        with self._lock:
            if worker in self._workers:  # close() may have taken them all
                self._workers.remove(worker)
            if worker.stopping and worker.holding is None:
                return  # it ended on its stop message, or was terminated while it started
            if worker.holding is not None:
                self._errors += 1  # the record went with it
            if not worker.reported:
                if worker.holding is not None:
                    where = f"while it held {worker.holding}"
                elif worker.ready:
                    where = "while it waited for records"
                else:
                    where = (
                        "before it was ready (where on_tensor is defined in the main script, "
                        "its training code must be under `if __name__ == '__main__':`)"
                    )
                self._note_failure(
                    f"a worker running on_tensor {self._name} (pid {worker.pid}) "
                    f"ended with {exit_description(code)} {where}",
                    "",
                )
            worker.holding = None
            if self._off or self._aborting or (self._closing and not self._pending):
                return
            self._restarts += 1
        try:
            self._start_worker()
        except Exception as error:
            with self._lock:
                self._note_failure(
                    f"a worker for on_tensor {self._name} could not start "
                    f"({type(error).__name__}: {error})",
                    traceback.format_exc(),
                )
                self._turn_off("a worker could not start")

    def _note_failure(self, summary: str, trace: str) -> None:
        """Count a failure in a row; warn for the first; turn off after too many. Locked."""
        self._failures_in_row += 1
        if self._first_failure is None:
            self._first_failure = summary
            detail = f"\n{trace.rstrip()}" if trace.strip() else ""
            self._due_warnings.append(
                f"layerscope: {summary}; training continues, a failed worker is replaced "
                f"and later failures are only counted{detail}"
            )
        if self._failures_in_row >= FAILURES_TO_TURN_OFF:
            self._turn_off(
                f"its workers failed {self._failures_in_row} times in a row with no tensor "
                f"processed in between (the last: {summary})"
            )

    def _turn_off(self, why: str) -> None:
        """Refuse further records and stop the workers (the monitor then ends). Locked."""
        if self._off:
            return
        self._off = True
        self._accepting = False
        self._abandoned += len(self._pending) + sum(w.holding is not None for w in self._workers)
        self._pending.clear()
        self._pending_bytes = 0
        for worker in self._workers:
            worker.holding = None
            worker.stopping = True
        self._due_warnings.append(
            f"layerscope: on_tensor {self._name} is off: {why}; later tensors are dropped "
            f"and counted, training continues"
        )
