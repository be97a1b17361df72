"""The readings of a flush as integer columns, and how they group into rows.

The training thread appends six integers a reading to one ``array``; the writer thread views
them as an ``(n, 6)`` int64 tensor and groups them with a few tensor operations, where a
Python loop over readings would hold the GIL that training needs.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import torch
from torch import Tensor

# Columns of a reading, in order.
STEP, IDENTITY, FORM, BUFFER, ROW, REPLACES = range(6)
FIELDS = 6

# (name, offset, length, is_scalar, numel) of a custom statistic in its buffer's loose values;
# numel weighs it when readings merge.
CustomRef = tuple[str, int, int, bool, int]


class Readings:
    """Recorded tensors of one flush: where each one's partials wait, and what it is.

    A reading's ``identity`` and ``form`` are interned codes; ``row`` is its row in buffer
    ``buffer``; ``replaces`` marks parameter and buffer kinds, whose last reading of a step is
    the one kept. Readings of the same step and identity merge into one row.
    """

    __slots__ = ("_values", "custom")

    def __init__(self) -> None:
        self._values = array("q")
        self.custom: dict[int, tuple[CustomRef, ...]] = {}  # by reading index, where any

    def __len__(self) -> int:
        return len(self._values) // FIELDS

    def add(
        self,
        step: int,
        identity: int,
        form: int,
        buffer: int,
        row: int,
        replaces: bool,
        custom: tuple[CustomRef, ...] = (),
    ) -> None:
        """Append one reading."""
        if custom:
            self.custom[len(self)] = custom
        self._values.extend((step, identity, form, buffer, row, replaces))

    def columns(self) -> Tensor:
        """``(n, FIELDS)`` int64, sharing the readings' memory."""
        if not self._values:
            return torch.empty(0, FIELDS, dtype=torch.int64)
        return torch.frombuffer(self._values, dtype=torch.int64).view(-1, FIELDS)


class Grouping(NamedTuple):
    """How readings form rows: groups in the order of their first reading."""

    first: Tensor  # (groups,) index of each group's first reading
    group: Tensor  # (readings,) group of each reading
    kept: Tensor | None  # (readings,) bool: readings a later replacing one did not drop


def group_readings(keys: Tensor, replaces: Tensor) -> Grouping:
    """Group readings by ``keys`` (int64, one per reading), in order of first appearance.

    A replacing reading drops the readings of its group before it: a group holds its last
    replacing reading and those after it, or all its readings where none replaces.

    Examples:
        >>> g = group_readings(torch.tensor([7, 3, 7, 3]), torch.tensor([0, 1, 0, 1]))
        >>> g.first.tolist(), g.group.tolist(), g.kept.tolist()
        ([0, 1], [0, 1, 0, 1], [True, False, True, True])
    """
    count = keys.shape[0]
    unique, inverse = torch.unique(keys, return_inverse=True)
    index = torch.arange(count)
    first_sorted = torch.full((unique.shape[0],), count, dtype=torch.int64)
    first_sorted.scatter_reduce_(0, inverse, index, reduce="amin")
    order = torch.argsort(first_sorted)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0])
    group = rank[inverse]
    kept = None
    replacing = replaces.nonzero().flatten()
    if replacing.numel():
        last = torch.full((order.shape[0],), -1, dtype=torch.int64)
        last.scatter_reduce_(0, group[replacing], replacing, reduce="amax")
        kept = index >= last[group]
        if bool(kept.all()):
            kept = None
    return Grouping(first_sorted[order], group, kept)
