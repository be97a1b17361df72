"""Where a watched run's whole tensors go after their step: off the training thread.

At the end of a step that kept tensors the training thread only starts their copy to the host
(non-blocking, into pinned memory, with an event on CUDA) and hands the batch over. A thread of
its own waits for the copy, then writes the batch as a part file of the run, keeps it in
memory for a run without a directory, and offers each tensor to the ``on_tensor`` workers. A
full queue drops the batch, counted, rather than make training wait.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from layerscope._errors import FailureCounter, LayerscopeWarning
from layerscope.tensors._parts import part_bytes
from layerscope.tensors._records import Record

QUEUE_SIZE = 8  # steps' batches waiting; whole tensors are big, so few


@dataclass(slots=True)
class Batch:
    """One step's records, their values on the host once ``ready`` has happened."""

    records: list[Record]
    ready: Any = None  # a torch.cuda.Event (or another accelerator's), None on the CPU


def to_host(records: list[Record]) -> Batch:
    """Start copying the records' values to host memory; the batch says when they are there.

    CPU values are already there. Others go into pinned memory with ``non_blocking=True``, one
    event recorded after the last copy: no host sync on the training thread.
    """
    ready = None
    for record in records:
        value = record.value
        if value.device.type == "cpu":
            continue
        pinned = value.device.type == "cuda"
        host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=pinned)
        host.copy_(value, non_blocking=pinned)
        record.value = host
        if pinned:
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch
    if ready is not None:
        ready.record()
    return Batch(records, ready)


class TensorOutlet:
    """The thread that writes, keeps and hands out whole tensors, one batch at a time.

    Args:
        write: ``write(batch, payload)`` stores the part file of the ``batch``-th batch (from
            1) in the run, or None for a run in memory, whose records this outlet keeps.
        keep: False hands tensors to ``offer`` only, neither writing nor keeping them.
        offer: ``offer(record)`` gives a record to the workers (never blocks), or None.
        failures: the scope's counter: a failure here is counted, never raised.
    """

    def __init__(
        self,
        write: Callable[[int, bytes], None] | None,
        keep: bool,
        offer: Callable[[Record], object] | None,
        failures: FailureCounter,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._write = write
        self._keep = keep
        self._offer = offer
        self._failures = failures
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=queue_size)
        self._kept: list[Record] = []
        self._lock = threading.Lock()
        self._batches = 0  # handled so far: parts are numbered by it
        self._dropped = 0  # records lost: no room in the queue, or a failed write
        self._drop_warning_due = False
        self._dropped_warned = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="layerscope-tensors", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Records not kept because the outlet was still busy with earlier steps."""
        return self._dropped

    def kept(self) -> list[Record]:
        """The records kept in memory (a run without a directory), in order."""
        with self._lock:
            return list(self._kept)

    def put(self, batch: Batch) -> None:
        """Hand a step's batch over; never waits: with the queue full it is dropped, counted."""
        if self._closed or not batch.records:
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._dropped += len(batch.records)
            self._drop_warning_due = not self._dropped_warned

    def count_dropped(self, records: int) -> None:
        """Count records lost before they reached the outlet (a copy that failed)."""
        self._dropped += records

    def warn_pending(self) -> None:
        """Warn once, on the training thread, that tensors were dropped."""
        if self._drop_warning_due and not self._dropped_warned:
            self._dropped_warned = True
            warnings.warn(
                "layerscope: whole tensors came faster than they could be written; a step's "
                "were dropped (scope.tensors_dropped counts them). Keep fewer: tensors= with "
                "every=, fewer modules or a stash_value",
                LayerscopeWarning,
                stacklevel=3,
            )

    def drain(self) -> None:
        """Wait until every batch handed over so far is written and offered."""
        if self._thread.is_alive():
            self._queue.join()

    def close(self, timeout: float | None = None) -> bool:
        """Finish the batches handed over, then stop; True if the thread ended in time."""
        if not self._closed:
            self._closed = True
            try:  # after the batches; a thread stuck in a write must not hold close for good
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                self._handle(batch)
            except Exception as error:  # monitoring never breaks training
                self._failures.record("writing whole tensors", error)
                self._dropped += 0 if batch is None else len(batch.records)
            finally:
                self._queue.task_done()

    def _handle(self, batch: Batch) -> None:
        if batch.ready is not None:
            batch.ready.synchronize()  # this thread waits for the copy, not training
        self._batches += 1
        if self._keep and self._write is not None:
            self._write(self._batches, part_bytes(batch.records))
        elif self._keep:
            with self._lock:
                self._kept.extend(batch.records)
        if self._offer is not None:
            for record in batch.records:
                self._offer(record)
