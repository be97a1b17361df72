"""The size below which torch runs an operation on the calling thread alone.

Past ``GRAIN`` elements torch splits an operation across its threads; on the writer thread
that contends with the training thread's own, and a descheduled helper stalls the rest. The
rules keep their tensors below it: a flush's columns are, and larger tables go in pieces.
"""

from __future__ import annotations

import torch
from torch import Tensor

GRAIN = 32768  # at::internal::GRAIN_SIZE


def pieces(total: int, width: int) -> list[tuple[int, int]]:
    """``(start, end)`` ranges of ``total`` rows of ``width`` elements, each below GRAIN."""
    step = max(1, GRAIN // max(width, 1))
    return [(start, min(start + step, total)) for start in range(0, total, step)]


def take(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` along the first dimension, on the calling thread."""
    return values.index_select(0, index)


def put(target: Tensor, index: Tensor, values: Tensor | float | bool) -> None:
    """``target[index] = values`` for a 1-D ``target`` and distinct indices, on this thread."""
    if isinstance(values, Tensor):
        target.scatter_(0, index, values.to(target.dtype))
    else:
        target.scatter_(0, index, torch.full(index.shape, values, dtype=target.dtype))


def put_at(target: Tensor, rows: Tensor, columns: Tensor, values: Tensor | float) -> None:
    """``target[rows, columns] = values`` for a contiguous 2-D ``target``, distinct places."""
    put(target.view(-1), rows * target.shape[1] + columns, values)


def counts_by(groups: Tensor, marked: Tensor, size: int) -> Tensor:
    """How many of the ``marked`` rows each group (0 to ``size - 1``) has."""
    return torch.zeros(size, dtype=torch.int64).scatter_add_(0, groups, marked.long())
