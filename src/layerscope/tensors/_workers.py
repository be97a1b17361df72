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
import contextlib
import functools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from torch import Tensor

from layerscope._errors import LayerscopeWarning
from layerscope.tensors._records import Record
from layerscope.tensors._worker_process import raw_bytes, worker_main, write_all

OnTensor = Callable[[Record, Path | None], object]

# Failures in a row, with no tensor processed in between, that turn the pool off.
FAILURES_TO_TURN_OFF = 3
# How long a terminated worker gets before it is killed.
_TERMINATE_GRACE_S = 1.0
_THREAD_NAME = "layerscope-on_tensor"


def check_on_tensor(on_tensor: object, workers: object) -> tuple[OnTensor | None, int]:
    """Check ``watch()``'s ``on_tensor`` and ``workers`` arguments.

    Args:
        on_tensor: None, or ``fn(record, directory)``: a callable that pickles by reference
            (a module-level function, a class instance with picklable state, a
            ``functools.partial``), since it runs in worker processes started by spawn.
        workers: None (one worker) or an int >= 1; only with ``on_tensor``.

    Returns:
        ``(on_tensor, workers)``; ``(None, 0)`` without ``on_tensor``.

    Raises:
        TypeError: ``on_tensor`` is not callable or does not pickle, or ``workers`` is not
            an int.
        ValueError: ``workers < 1``, or ``workers`` without ``on_tensor``.

    Examples:
        >>> import functools
        >>> check_on_tensor(functools.partial(print, end=""), None)[1]
        1
        >>> check_on_tensor(lambda record, directory: None, 2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: on_tensor: must pickle by reference to run in worker processes, ...
    """
    if on_tensor is None:
        if workers is not None:
            raise ValueError("workers: only used with on_tensor=fn, which was not given")
        return None, 0
    count = _check_workers(workers)
    if not callable(on_tensor):
        raise TypeError(
            f"on_tensor: expected a callable fn(record, directory), got {type(on_tensor).__name__}"
        )
    _check_importable(on_tensor)  # watch() starts its workers by spawn
    _pickled(on_tensor)
    return on_tensor, count


def _check_importable(fn: object) -> None:
    """A spawned worker imports ``fn``'s module: not possible for a notebook's or a REPL's."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(target, "__module__", None)
    if not isinstance(getattr(target, "__qualname__", None), str):
        module = type(target).__module__  # an instance: its class is what gets imported
    main = sys.modules.get("__main__")
    if module == "__main__" and main is not None and not hasattr(main, "__file__"):
        raise TypeError(
            f"on_tensor: {_callback_name(fn)} is defined in an interactive session, which "
            f"worker processes cannot import; define it in a module and import it"
        )


def _check_workers(workers: object) -> int:
    if workers is None:
        return 1
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"workers: expected an int >= 1, got {type(workers).__name__}")
    if workers < 1:
        raise ValueError(f"workers: expected an int >= 1, got {workers}")
    return workers


def _pickled(fn: object) -> bytes:
    try:
        return pickle.dumps(fn)
    except Exception as error:
        raise TypeError(
            f"on_tensor: must pickle by reference to run in worker processes, and "
            f"{_callback_name(fn)} does not ({type(error).__name__}: {error}); define it at "
            f"module level, or use functools.partial of a module-level function"
        ) from error


def _callback_name(fn: object) -> str:
    """A short name for ``fn`` in messages: ``module.qualname``, or its type's."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({_callback_name(fn.func)}, ...)"
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str):
        name, module = qualname, getattr(fn, "__module__", None)
    else:
        name, module = f"{type(fn).__qualname__} instance", type(fn).__module__
    return f"{module}.{name}" if isinstance(module, str) else name


@dataclass(eq=False)
class _Worker:
    """The parent's handle on one worker process."""

    process: BaseProcess
    pid: int  # kept: a closed process has none
    connection: Connection
    ready: bool = False
    holding: str | None = None  # the record it is working on, described for messages
    stopping: bool = False  # sent the stop message
    reported: bool = False  # reported its callback's error and exits by itself
    eof: bool = False  # its pipe closed: wait on its sentinel only


class TensorWorkers:
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
        self._count = _check_workers(workers)
        size = 2 * self._count if queue_size is None else queue_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"queue_size: expected an int >= 1, got {size!r}")
        # typeshed's BaseContext has no Process attribute; every real context has.
        self._context: Any = multiprocessing.get_context(start_method)
        if start_method != "fork":  # a forked worker has the parent's modules already
            _check_importable(fn)
        self._fn_bytes = _pickled(fn)
        self._name = _callback_name(fn)
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
        self._workers: list[_Worker] = []
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
            self._stop_processes(self._workers)
            self._close_wake_pipe()
            raise
        self._monitor = threading.Thread(target=self._run, name=_THREAD_NAME, daemon=True)
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
            size = _value_bytes(record)
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
            self._monitor.join(_TERMINATE_GRACE_S)
        with self._lock:
            left = list(self._workers)
        # Also unblocks a monitor stuck sending to a worker that stopped reading.
        self._stop_processes(left)
        self._monitor.join(_TERMINATE_GRACE_S)
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
        parent_end, child_end = self._context.Pipe()
        process: BaseProcess = self._context.Process(
            target=worker_main,
            args=(child_end, self._fn_bytes, self._directory),
            name=f"{_THREAD_NAME}-worker",
            daemon=True,  # the last resort: multiprocessing terminates daemons at exit
        )
        # The child inherits this thread's signal mask across fork and exec: SIGINT stays
        # blocked until the worker ignores it, so Ctrl-C while it starts does not reach it.
        blocked = hasattr(signal, "pthread_sigmask")
        if blocked and self._context.get_start_method() != "fork":
            # Its first start unblocks SIGINT in this thread as it ends: start it before.
            resource_tracker.ensure_running()
        if blocked:
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            child_end.close()  # so the parent sees the pipe close when the worker dies
        worker = _Worker(process, process.pid or 0, parent_end)
        with self._lock:
            late = self._aborting  # close() gave up meanwhile and took its list of workers
            if not late:
                self._workers.append(worker)
        if late:
            self._stop_processes([worker])
            parent_end.close()

    # The monitor thread.

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
            self._stop_processes(left)

    def _serve(self) -> None:
        left: list[_Worker] = []
        while True:
            sends: list[tuple[_Worker, Record | None]] = []
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
                        self._pending_bytes -= _value_bytes(taken)
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
            self._stop_processes(left)
            for worker in left:
                worker.connection.close()

    def _send(self, worker: _Worker, record: Record | None) -> None:
        if record is None:
            with contextlib.suppress(OSError):  # it died: handled when its sentinel fires
                worker.connection.send(None)
            return
        try:
            value, data = raw_bytes(record.value)
            header = (record.metadata(), value.dtype, tuple(value.shape), len(data))
            pickled = pickle.dumps(header)  # what Connection.send does, before a byte is sent
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
            worker.connection.send_bytes(pickled)
            write_all(worker.connection, data)
        except OSError:
            pass  # it died: its exit is handled when its sentinel fires
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

    def _read_messages(self, worker: _Worker) -> None:
        while not worker.eof:
            try:
                if not worker.connection.poll():
                    return
                message = worker.connection.recv()
            except (EOFError, OSError):
                worker.eof = True
                return
            self._on_message(worker, message)

    def _on_message(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        with self._lock:
            kind = message[0]
            if kind == "ready":
                worker.ready = True
            elif kind == "done":
                worker.holding = None
                self._processed += 1
                self._failures_in_row = 0
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

    def _on_exit(self, worker: _Worker) -> None:
        self._read_messages(worker)  # what it sent before it ended
        worker.process.join(_TERMINATE_GRACE_S)
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
                    f"ended with {_exit_description(code)} {where}",
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

    @staticmethod
    def _stop_processes(workers: list[_Worker]) -> None:
        """Terminate, then kill, every worker process in ``workers``, and reap it."""
        for worker in workers:
            with contextlib.suppress(ValueError):  # closed already: it ended
                if worker.process.is_alive():
                    worker.process.terminate()
        deadline = time.monotonic() + _TERMINATE_GRACE_S
        for worker in workers:
            with contextlib.suppress(ValueError):  # closed already: it ended
                worker.process.join(max(deadline - time.monotonic(), 0.0))
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
                worker.process.close()


def _value_bytes(record: Record) -> int:
    value = record.value
    return value.numel() * value.element_size() if isinstance(value, Tensor) else 0


def _exit_description(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
