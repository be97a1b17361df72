"""A worker process of ``TensorWorkers``, and how a tensor crosses the pipe to it.

A tensor travels as its raw bytes after a small pickled header: written from its memory by the
parent's monitor thread, read straight into the worker's buffer, around which the worker
rebuilds the ``Record``. Nothing is pickled but the header, and no torch shared memory is used,
which a dead worker could leak.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from layerscope.tensors._records import Record
from layerscope.tensors._skipped import SkippedTensorError

# A worker exits with this code after it reported its callback's error.
_EXIT_AFTER_ERROR = 3
# How often an idle worker checks that its parent still lives (a fork child does not see
# its pipe close, since it inherited the parent's end too).
_PARENT_CHECK_S = 0.5


def raw_bytes(value: Tensor) -> tuple[Tensor, memoryview]:
    """A contiguous CPU tensor with ``value``'s elements, and its memory as bytes (no copy).

    The view reads the tensor's memory: keep the tensor while the view is in use.
    """
    compact = value.detach().resolve_conj().resolve_neg().cpu().contiguous()
    size = compact.numel() * compact.element_size()
    if size == 0:
        return compact, memoryview(b"")
    return compact, memoryview((ctypes.c_ubyte * size).from_address(compact.data_ptr()))


# Raw bytes after a header, on POSIX: Connection.recv_bytes_into reads through a growing
# BytesIO and copies, ~8x slower for 1 MiB than reading into the buffer (2.2 vs 0.29 ms).
_RAW_PIPE = hasattr(os, "readv")


def write_all(connection: Connection, data: memoryview) -> None:
    if not _RAW_PIPE:
        connection.send_bytes(data)
        return
    written = 0
    while written < len(data):
        written += os.write(connection.fileno(), data[written:])


def _read_all(connection: Connection, buffer: bytearray) -> None:
    if not _RAW_PIPE:
        connection.recv_bytes_into(buffer)
        return
    view = memoryview(buffer)
    read = 0
    while read < len(buffer):
        count = os.readv(connection.fileno(), [view[read:]])
        if count == 0:
            raise EOFError("the parent closed the pipe in the middle of a tensor")
        read += count


def worker_main(connection: Connection, fn_bytes: bytes, directory: Path | None) -> None:
    """Run ``fn`` on each record the parent sends, until told to stop or the parent is gone."""
    parent_pid = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the training process
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        fn = pickle.loads(fn_bytes)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
    except BaseException as error:
        _report(connection, error)
        sys.exit(_EXIT_AFTER_ERROR)
    # Terminated (close() gave up waiting): end through the finally below, so that a
    # callback with a close() (a Video) still finishes its files; killed, nothing runs.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        connection.send(("ready",))
        while not _terminate_asked:
            if not connection.poll(_PARENT_CHECK_S):
                if os.getppid() != parent_pid:
                    return  # orphaned: the parent died
                continue
            header = connection.recv()
            if header is None:
                return
            skipped = None
            try:
                fn(_received_record(connection, header), directory)
            except _Terminated:
                raise
            except SkippedTensorError as passed_over:  # one record the callback cannot use
                skipped = str(passed_over)
            except BaseException as error:
                _report(connection, error)
                sys.exit(_EXIT_AFTER_ERROR)
            _report_done(connection, skipped)
    except (EOFError, OSError):
        return  # the pipe closed: the parent is gone
    except _Terminated:
        return
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
        _close(fn)


class _Terminated(BaseException):
    """SIGTERM reached the worker."""


# Set by SIGTERM's handler. The exception it raises is swallowed where it lands in a weakref
# callback or a __del__ (Python only prints it): the loop ends on the flag then.
_terminate_asked = False
_raising = True  # False while a finished record is reported: SIGTERM only ends the loop then


def _terminated(signum: int, frame: object) -> None:
    global _terminate_asked
    _terminate_asked = True
    if _raising:
        raise _Terminated


def _report_done(connection: Connection, skipped: str | None = None) -> None:
    """Say the record is done; a SIGTERM meanwhile ends the loop after, not the report.

    ``skipped``: why the callback passed the record over, if it did.
    """
    global _raising
    _raising = False
    try:
        connection.send(("done",) if skipped is None else ("done", skipped))
    finally:
        _raising = True


def _close(fn: Any) -> None:
    """Let a callback with a ``close()`` (a ``Video``) finish its files as its worker ends."""
    close = getattr(fn, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception:  # the worker ends all the same; its stderr is the run's
        print("layerscope: on_tensor's close() failed in its worker:", file=sys.stderr)
        traceback.print_exc()


def _received_record(connection: Connection, header: tuple[Any, ...]) -> Record:
    metadata, dtype, shape, size = header
    data = bytearray(size)
    _read_all(connection, data)
    if size == 0:
        value = torch.empty(shape, dtype=dtype)
    else:
        value = torch.frombuffer(data, dtype=dtype).reshape(shape)
    return Record(**metadata, value=value)


def _report(connection: Connection, error: BaseException) -> None:
    trace = "".join(traceback.format_exception(error))
    try:
        text = str(error)
    except Exception:
        text = "<the error's str() failed>"
    with contextlib.suppress(OSError):  # the parent is gone
        connection.send(("failed", type(error).__name__, text, trace))
