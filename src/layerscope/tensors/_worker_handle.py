"""One worker process as the pool sees it: started, fed, stopped and its end described.

The parent's side of the pipe protocol of ``_worker_process``: a record travels as a small
pickled header followed by its tensor's raw bytes.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from torch import Tensor

from layerscope.tensors._records import Record
from layerscope.tensors._worker_process import raw_bytes, worker_main, write_all

# How long a terminated worker gets before it is killed.
TERMINATE_GRACE_S = 1.0


@dataclass(eq=False)
class Worker:
    """The parent's handle on one worker process."""

    process: BaseProcess
    pid: int  # kept: a closed process has none
    connection: Connection
    ready: bool = False
    holding: str | None = None  # the record it is working on, described for messages
    stopping: bool = False  # sent the stop message
    reported: bool = False  # reported its callback's error and exits by itself
    eof: bool = False  # its pipe closed: wait on its sentinel only


def start_worker(context: Any, fn_bytes: bytes, directory: Path | None, name: str) -> Worker:
    """Start one worker process running the pickled ``fn_bytes``, with SIGINT kept from it.

    Args:
        context: the ``multiprocessing`` context to start it with.
        fn_bytes: the pickled callback.
        directory: where the callback writes, or None.
        name: the process's name.
    """
    parent_end, child_end = context.Pipe()
    process: BaseProcess = context.Process(
        target=worker_main,
        args=(child_end, fn_bytes, directory),
        name=name,
        daemon=True,  # the last resort: multiprocessing terminates daemons at exit
    )
    # The child inherits this thread's signal mask across fork and exec: SIGINT stays
    # blocked until the worker ignores it, so Ctrl-C while it starts does not reach it.
    blocked = hasattr(signal, "pthread_sigmask")
    if blocked and context.get_start_method() != "fork":
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
    return Worker(process, process.pid or 0, parent_end)


def encode_header(record: Record) -> tuple[bytes, Any, Any]:
    """The pickled header of ``record``, its value and the raw bytes that follow it.

    Raises whatever pickling or reading the value raises; nothing has been sent then.
    """
    value, data = raw_bytes(record.value)
    header = (record.metadata(), value.dtype, tuple(value.shape), len(data))
    return pickle.dumps(header), value, data  # what Connection.send does, before a byte is sent


def send_encoded(worker: Worker, pickled: bytes, data: Any) -> None:
    """Send a header and its bytes; a dead worker's exit is handled when its sentinel fires."""
    try:
        worker.connection.send_bytes(pickled)
        write_all(worker.connection, data)
    except OSError:
        pass


def send_stop(worker: Worker) -> None:
    """Ask ``worker`` to end once idle."""
    with contextlib.suppress(OSError):  # it died: handled when its sentinel fires
        worker.connection.send(None)


def stop_processes(workers: list[Worker]) -> None:
    """Terminate, then kill, every worker process in ``workers``, and reap it."""
    for worker in workers:
        with contextlib.suppress(ValueError):  # closed already: it ended
            if worker.process.is_alive():
                worker.process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for worker in workers:
        with contextlib.suppress(ValueError):  # closed already: it ended
            worker.process.join(max(deadline - time.monotonic(), 0.0))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.process.close()


def value_bytes(record: Record) -> int:
    """How many bytes ``record``'s value holds (0 when it is no tensor)."""
    value = record.value
    return value.numel() * value.element_size() if isinstance(value, Tensor) else 0


def exit_description(code: int | None) -> str:
    """A worker's exit code in words: ``signal SIGKILL``, ``exit code 1``."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
