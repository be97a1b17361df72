"""A scope's whole tensors: ``watch(tensors=..., on_tensor=..., workers=...)`` put together.

The capture (``RunTensors``) hooks the chosen modules in the steps that keep tensors; the
outlet's thread writes each step's batch into the run, or keeps it for a run in memory, and
offers it to the worker processes that run ``on_tensor``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from layerscope._errors import FailureCounter
from layerscope.distributed import ProcessRank
from layerscope.tensors import (
    DIRECTORY,
    PartFolder,
    Record,
    RunTensors,
    SavedCapture,
    TensorOutlet,
    TensorsSpec,
    read_parts,
)

if TYPE_CHECKING:
    from layerscope.store import ParquetStore
    from layerscope.tensors import TensorWorkers

# What may wait for the workers: enough for the seconds a spawned worker takes to start,
# bounded in bytes for big tensors.
QUEUE_RECORDS = 64
QUEUE_BYTES = 256 << 20


class WholeTensors:
    """What a scope keeps of whole tensors, and the workers it hands them to."""

    def __init__(
        self,
        model: nn.Module,
        spec: TensorsSpec,
        store: ParquetStore | None,
        place: ProcessRank,
        failures: FailureCounter,
        step_now: Callable[[], int],
        training_now: Callable[[], bool],
        records_statistics: Callable[[int], bool],
        first_step: int,
        on_tensor: Callable[[Record, Path | None], object] | None = None,
        workers: int = 0,
        optimizers: Sequence[torch.optim.Optimizer] = (),
    ) -> None:
        # Weight gradients are read where the optimizers see them, as the statistics are.
        spec = replace(spec, options=replace(spec.options, optimizers=tuple(optimizers)))
        self._spec = spec
        self._place = place
        self._fs: Any = None
        self._root = ""
        self._parts: PartFolder | None = None  # made at the first part: the rank is known then
        if store is not None:
            from layerscope.store.locations import location_filesystem

            # Its own filesystem object, as the store's: no transaction of the training holds it.
            self._fs, root = location_filesystem(
                store.path, fresh=True, storage_options=store.storage_options
            )
            self._root = root.rstrip("/")
        self.workers: TensorWorkers | None = None
        if on_tensor is not None:
            from layerscope.tensors import TensorWorkers

            self.workers = TensorWorkers(
                on_tensor,
                workers,
                self._local_directory(),
                queue_size=QUEUE_RECORDS,
                queue_bytes=QUEUE_BYTES,
            )
        self._outlet = TensorOutlet(
            self._write if store is not None else None,
            spec.keep,
            None if self.workers is None else self.workers.submit,
            failures,
        )
        try:
            self._capture = RunTensors(
                model,
                spec,
                self._outlet,
                step_now,
                training_now,
                records_statistics,
                first_step,
                failures,
            )
        except BaseException:
            self.close()
            raise

    @property
    def dropped(self) -> int:
        """Tensors not kept: over ``max_bytes``, or come while earlier steps' were written."""
        return self._capture.skipped + self._outlet.dropped

    def end_step(self, ended: int, next_step: int) -> None:
        """Step ``ended`` ended; ``next_step`` begins."""
        self._capture.end_step(ended, next_step)
        if self.workers is not None:
            self.workers.warn_pending()  # the workers' errors, told on the training thread

    def drain(self) -> None:
        """Wait until what the steps so far kept is written (or kept) and offered."""
        self._outlet.drain()

    def records(self) -> SavedCapture:
        """What was kept so far, read back from the run's files or from memory."""
        self.drain()
        info = {"tensors": self._spec.to_dict()}
        if self._fs is None:
            return SavedCapture(self._outlet.kept(), info)
        return SavedCapture(read_parts(self._fs, f"{self._rank_place()}/{DIRECTORY}"), info)

    def close(self, timeout: float | None = None) -> None:
        """Remove the hooks, write what is pending, stop the outlet and the workers."""
        capture = getattr(self, "_capture", None)
        if capture is not None:
            capture.finish()
        self._outlet.close(timeout)
        if self.workers is not None:
            self.workers.close(10.0 if timeout is None else timeout)

    def _write(self, batch: int, payload: bytes) -> None:
        if self._parts is None:
            self._parts = PartFolder(self._fs, f"{self._rank_place()}/{DIRECTORY}")
        self._parts.write(batch, payload)

    def _rank_place(self) -> str:
        from layerscope.store import rank_directory

        return f"{self._root}/{rank_directory(self._place.rank)}".rstrip("/")

    def _local_directory(self) -> Path | None:
        """Where callbacks write: this rank's place in the run, if on the local disk."""
        if self._fs is None or "file" not in _protocols(self._fs):
            return None
        from layerscope.store import rank_directory

        # The rank if known by now; a process group made after watch() is not waited for.
        known = self._place.peek()
        return Path(self._root) / rank_directory(known[0] if known else 0)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
