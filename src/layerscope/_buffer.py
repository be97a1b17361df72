"""Device-side rows of partials, filled in the hot path and brought to the host once per flush.

Each row holds the partials of one recorded tensor followed by its histogram: float64 keeps
the histogram counts exact (below 2**53) and lets partials and histogram share one buffer. Loose
values (custom statistics, scalar tensors) gather in a list beside it. A flush concatenates
both into one payload and copies it to the host in one transfer: non-blocking into pinned
memory on CUDA, with an event to wait on before the host reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from layerscope.stats import WIDTH


@dataclass(slots=True)
class HostCopy:
    """A payload on its way to the host; ``wait()`` returns it once it has arrived."""

    # (rows * row_width + values,) float64: on the host, or on a device other than CUDA,
    # from which the writer thread copies it
    payload: Tensor
    rows: int
    row_width: int
    event: torch.cuda.Event | None

    def wait(self) -> tuple[Tensor, Tensor]:
        """Block until the copy has landed; return ``(rows, values)``."""
        if self.event is not None:
            self.event.synchronize()
        payload = self.payload.cpu()  # a no-op on the host; a blocking copy from MPS or XPU
        split = self.rows * self.row_width
        return payload[:split].view(self.rows, self.row_width), payload[split:]


class DeviceRows:
    """Preallocated rows of partials on one device; grows by doubling, never syncs."""

    def __init__(self, device: torch.device, hist_slots: int, capacity: int = 64) -> None:
        self.device = device
        self.row_width = WIDTH + hist_slots
        self._data = torch.zeros(capacity, self.row_width, dtype=torch.float64, device=device)
        self._size = 0
        self._values: list[Tensor] = []
        self._values_size = 0

    def __len__(self) -> int:
        return self._size

    def has_content(self) -> bool:
        """Whether anything waits to be taken."""
        return self._size > 0 or self._values_size > 0

    def append(self, row: Tensor, hist: Tensor | None) -> int:
        """Store one row of partials (and its histogram); return its index."""
        if self._size == self._data.shape[0]:
            grown = self._data.new_zeros(2 * self._size, self.row_width)
            grown[: self._size] = self._data
            self._data = grown
        index = self._size
        self._data[index, :WIDTH] = row
        if hist is not None:
            self._data[index, WIDTH:] = hist
        self._size += 1
        return index

    def add_values(self, values: Tensor) -> tuple[int, int]:
        """Store loose values (any shape, flattened); return their offset and length."""
        flat = values.detach().reshape(-1).to(device=self.device, dtype=torch.float64)
        offset = self._values_size
        self._values.append(flat)
        self._values_size += flat.numel()
        return offset, flat.numel()

    def take(self) -> HostCopy:
        """Start the copy of everything stored so far to the host and empty the buffer.

        The buffer is reused at once: a later write is queued on the same stream after the
        copy, so it cannot change what the copy reads.
        """
        payload = torch.cat([self._data[: self._size].reshape(-1), *self._values])
        rows = self._size
        self._size = 0
        self._values = []
        self._values_size = 0
        if self.device.type != "cuda":
            # A fresh tensor, so the writer thread can copy it later, off the training thread.
            return HostCopy(payload, rows, self.row_width, None)
        host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
        host.copy_(payload, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch
        event.record()
        return HostCopy(host, rows, self.row_width, event)
