"""Device-side rows of partials, filled in the hot path and brought to the host once per flush.

Each row holds the partials of one recorded tensor followed by its histogram: float64 keeps
the histogram counts exact (below 2**53) and lets partials and histogram share one buffer. Loose
values (custom statistics, scalar tensors) gather in a list beside it, and so do the sentinel's
extremes: one (min, max) pair per tensor watched, as 0-d tensors from ``aminmax`` or as blocks
of pairs that one launch wrote for a group of tensors (on the CPU the C kernel writes each
pair into a matrix of its own). A flush concatenates all of it into one payload and
copies it to the host in one transfer: non-blocking into pinned memory on CUDA, with an event
to wait on before the host reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from layerscope.stats import WIDTH, Field, write_extremes, write_group_extremes


@dataclass(slots=True)
class HostCopy:
    """A payload on its way to the host; ``wait()`` returns it once it has arrived."""

    # (rows * row_width + values,) float64: on the host, or on a device other than CUDA,
    # from which the writer thread copies it
    payload: Tensor
    rows: int
    row_width: int
    event: torch.cuda.Event | None
    extremes: int = 0  # (min, max) pairs at the payload's end

    def wait(self) -> Arrived:
        """Block until the copy has landed; return its rows, values and extremes."""
        if self.event is not None:
            self.event.synchronize()
        payload = self.payload.cpu()  # a no-op on the host; a blocking copy from MPS or XPU
        split = self.rows * self.row_width
        end = payload.shape[0] - 2 * self.extremes
        return Arrived(
            payload[:split].view(self.rows, self.row_width),
            payload[split:end],
            payload[end:].view(self.extremes, 2),
        )


class Arrived(NamedTuple):
    """A payload on the host: rows of partials, loose values, and (min, max) pairs."""

    rows: Tensor
    values: Tensor
    extremes: Tensor


class DeviceRows:
    """Preallocated rows of partials on one device; grows by doubling, never syncs."""

    def __init__(self, device: torch.device, hist_slots: int, capacity: int = 64) -> None:
        self.device = device
        self.row_width = WIDTH + hist_slots
        self._data = torch.zeros(capacity, self.row_width, dtype=torch.float64, device=device)
        self._size = 0
        self._values: list[Tensor] = []
        self._values_size = 0
        # On the CPU the sentinel's pairs are written in place (see add_extremes); elsewhere
        # they are 0-d minima and maxima since the last block, and blocks of pairs.
        self._pairs = torch.empty(0, 2, dtype=torch.float64) if device.type == "cpu" else None
        self._extremes: list[Tensor] = []
        self._blocks: list[Tensor] = []
        self._pair_count = 0

    def __len__(self) -> int:
        return self._size

    def has_content(self) -> bool:
        """Whether anything waits to be taken."""
        return self._size > 0 or self._values_size > 0 or self._pair_count > 0

    @property
    def data(self) -> Tensor:
        """The rows, ``(capacity, row_width)``; ``reserve`` may replace it by a larger one."""
        return self._data

    def reserve(self, count: int = 1) -> int:
        """Add ``count`` rows for kernels to write partials into; return the first one's index.

        The rows are ``data[index:index + count]``.
        """
        needed = self._size + count
        if needed > self._data.shape[0]:
            grown = self._data.new_zeros(max(2 * self._data.shape[0], needed), self.row_width)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        index = self._size
        self._size = needed
        return index

    def add_values(self, values: Tensor) -> tuple[int, int]:
        """Store loose values (any shape, flattened); return their offset and length."""
        # A copy, always: a float64 value on this device would otherwise stay a view of
        # memory that training may change in place before the flush.
        flat = values.detach().reshape(-1).to(device=self.device, dtype=torch.float64, copy=True)
        offset = self._values_size
        self._values.append(flat)
        self._values_size += flat.numel()
        return offset, flat.numel()

    def add_extremes(self, tensor: Tensor) -> int:
        """Keep the minimum and maximum of a non-empty floating ``tensor``; return their index.

        On the CPU they are written in place (by the C kernel where it reads the dtype);
        elsewhere one ``aminmax`` gives 0-d results, stacked at the flush in one operation.
        """
        index = self._pair_count
        if self._pairs is None:
            with torch.no_grad():
                low, high = torch.aminmax(tensor.detach())
            self._extremes += (low, high)
        else:
            write_extremes(tensor, self._room_for_pairs(1), index)
        self._pair_count += 1
        return index

    def add_group_extremes(self, tensors: list[Tensor]) -> int:
        """Keep the (min, max) of each of ``tensors``; return the first one's index.

        The tensors are floating and not empty; on a GPU one launch pair reads a group of one
        dtype.
        """
        index = self._pair_count
        if self._pairs is None:
            self._close_run()
            block = torch.empty(len(tensors), 2, dtype=torch.float64, device=self.device)
            self._blocks.append(block)
        else:
            block = self._room_for_pairs(len(tensors))[index : index + len(tensors)]
        write_group_extremes(tensors, block)
        self._pair_count += len(tensors)
        return index

    def _room_for_pairs(self, count: int) -> Tensor:
        """The CPU's pair matrix, grown to hold ``count`` more pairs."""
        pairs = self._pairs
        assert pairs is not None
        needed = self._pair_count + count
        if needed > pairs.shape[0]:
            grown = pairs.new_empty(max(64, 2 * pairs.shape[0], needed), 2)
            grown[: self._pair_count] = pairs[: self._pair_count]
            self._pairs = pairs = grown
        return pairs

    def _close_run(self) -> None:
        """Stack the 0-d extremes since the last block into a block (off the CPU)."""
        if self._extremes:  # one stack for all; it promotes bf16 and fp16 to fp32
            self._blocks.append(torch.stack(self._extremes).to(torch.float64).view(-1, 2))
            self._extremes = []

    def _all_pairs(self) -> Tensor:
        """Every pair kept since the last take, ``(pairs, 2)`` float64, in index order."""
        if self._pairs is not None:
            return self._pairs[: self._pair_count]
        self._close_run()
        if not self._blocks:
            return torch.empty(0, 2, dtype=torch.float64, device=self.device)
        return self._blocks[0] if len(self._blocks) == 1 else torch.cat(self._blocks)

    def nonfinite_rows(self, rows: Tensor) -> Tensor:
        """Whether each of ``rows`` (indices) counted a NaN or an Inf: a bool device tensor."""
        counts = self._data[rows.to(self.device)][:, [Field.NAN, Field.INF]]
        return counts.sum(dim=1) > 0

    def nonfinite_pairs(self, pairs: Tensor) -> Tensor:
        """Whether each of ``pairs`` (indices) is not finite: NaN or Inf in its tensor."""
        chosen = self._all_pairs()[pairs.to(self.device)]
        return ~torch.isfinite(chosen).all(dim=1)

    def take(self) -> HostCopy:
        """Start the copy of everything stored so far to the host and empty the buffer.

        The buffer is reused at once: a later write is queued on the same stream after the
        copy, so it cannot change what the copy reads.
        """
        parts = [self._data[: self._size].reshape(-1), *self._values]
        if self._pair_count:
            parts.append(self._all_pairs().reshape(-1))
        payload = torch.cat(parts)  # a copy: the buffers are reused at once
        rows, extremes = self._size, self._pair_count
        self._size = 0
        self._values = []
        self._values_size = 0
        self._blocks = []
        self._pair_count = 0
        if self.device.type != "cuda":
            # A fresh tensor, so the writer thread can copy it later, off the training thread.
            return HostCopy(payload, rows, self.row_width, None, extremes)
        host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
        host.copy_(payload, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch
        event.record()
        return HostCopy(host, rows, self.row_width, event, extremes)
