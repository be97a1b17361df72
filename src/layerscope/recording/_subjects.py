"""What the hooks hand the recorder, and where the recorder hands its batches.

A reading is about a watched module (``Target``), or a parameter and the modules that own it
(``Owner``); a group of tensors read at once comes as ``GroupEntry``s. The recorder's batches
go to a ``BatchOutlet``: the writer thread's queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from torch import Tensor

from layerscope.recording._batches import Batch


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

    def submit(self, item: Batch) -> None: ...

    def count_dropped(self, rows: int, scalars: int) -> None: ...
