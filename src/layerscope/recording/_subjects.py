"""What the hooks hand the recorder, and where the recorder hands its batches.

A reading is about a watched module (``Target``), or a parameter and the modules that own it
(``Owner``); a group of tensors read at once comes as ``GroupEntry``s. The recorder's batches
go to a ``BatchOutlet``: the writer thread's queue, which also says whether its sinks draw
histograms of signed values (``counted_histogram``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from torch import Tensor

from layerscope.recording._batches import Batch
from layerscope.stats import HistogramSpec, Log2Histogram, SignedLog2Histogram


@dataclass(frozen=True, slots=True)
class Target:
    """A watched module."""

    name: str
    module_type: str


@dataclass(frozen=True, slots=True)
class Owner:
    """A watched module owning a parameter or buffer as ``tensor``; tied ones have several."""

    module: str
    module_type: str
    tensor: str


class GroupEntry(NamedTuple):
    """A tensor of a group read at once: ``record``'s arguments for it."""

    target: Target
    name: str
    tensor: Tensor
    also_owned_by: Sequence[Owner] = ()
    shard: str | None = None


class BatchOutlet(Protocol):
    """Where a flush's batch goes: the writer thread's queue."""

    @property
    def signed_histograms(self) -> bool:
        """Whether a sink behind it draws histograms of signed values (TensorBoard, W&B)."""
        ...

    def submit(self, item: Batch) -> None: ...

    def count_dropped(self, rows: int, scalars: int) -> None: ...


def counted_histogram(histogram: HistogramSpec | None, outlet: BatchOutlet) -> HistogramSpec | None:
    """The histogram the kernels count: ``histogram``, or the log2 one split by sign.

    Split where a sink behind ``outlet`` draws signed values. The split takes the C kernel's
    vector copies nearly twice as long on values of both signs (``benchmarks/kernel.py``),
    so a run without such a sink does not count it. The writer keeps the magnitudes, the
    sum of the halves, as the rows' ``hist``.
    """
    if isinstance(histogram, Log2Histogram) and outlet.signed_histograms:
        return SignedLog2Histogram()
    return histogram
