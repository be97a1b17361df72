"""Square roots of element counts, rounded as ``math.sqrt`` rounds them.

A row's scale is ``l2 / sqrt(numel)``; torch's float64 square root may differ from the
correctly rounded one in the last bit, which would move a value across a threshold that the
rules compare exactly. A tensor's count rarely changes from step to step: each layer's last
count and its root, taken in Python, are kept, and only rows whose count changed are rooted
again.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from layerscope.health._small_ops import put, take


class Roots:
    """``sqrt(numel)`` for a column of counts, NaN where the count is not above zero."""

    def __init__(self) -> None:
        self._counts = torch.zeros(0, dtype=torch.float64)  # by key: the last count, or NaN
        self._roots = torch.zeros(0, dtype=torch.float64)

    def of(self, numel: Tensor, keys: Tensor, key_count: int) -> Tensor:
        """The roots of ``numel`` (float64, NaN where missing), rows keyed by ``keys``."""
        more = key_count - len(self._counts)
        if more > 0:
            self._counts = torch.cat([self._counts, torch.full((more,), math.nan).double()])
            self._roots = torch.cat([self._roots, torch.zeros(more, dtype=torch.float64)])
        known = take(self._counts, keys) == numel
        roots = torch.where(known, take(self._roots, keys), math.nan)
        new = ((numel > 0) & ~known).nonzero().flatten()
        if len(new):
            counts = take(numel, new)
            fresh = torch.tensor([math.sqrt(c) for c in counts.tolist()], dtype=torch.float64)
            roots.scatter_(0, new, fresh)
            # One row per key tells the table its count (the last, as rows come in order).
            last = torch.full((key_count,), -1, dtype=torch.int64)
            last.scatter_reduce_(0, take(keys, new), torch.arange(len(new)), "amax")
            chosen = (last >= 0).nonzero().flatten()
            rows = take(last, chosen)
            put(self._counts, chosen, take(counts, rows))
            put(self._roots, chosen, take(fresh, rows))
        return roots
