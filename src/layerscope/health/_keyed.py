"""Per-key bookkeeping over a flush's rows, without a Python loop over them.

The rules keep state per layer (a key: a dense id); a flush may bring several steps' rows of a
key, which must be taken in step order.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable

import torch
from torch import Tensor

from layerscope.health._small_ops import pieces, put, put_at, take


def earlier(views: Tensor, keys: Tensor, view_count: int, key_count: int) -> Tensor:
    """For each row, how many rows of its key come in earlier views (one row per view)."""
    if view_count <= 1 or not len(keys):
        return torch.zeros_like(keys)
    present = torch.zeros((key_count, view_count), dtype=torch.int64)
    put_at(present, keys, views, 1)
    for first, last in pieces(key_count, view_count):
        present[first:last] = present[first:last].cumsum(1) - present[first:last]
    return take(present.view(-1), keys * view_count + views)


def latest(views: Tensor, keys: Tensor, view_count: int, key_count: int) -> Tensor:
    """``(key_count, view_count)``: the latest view up to each view with a row of each key."""
    seen = torch.full((key_count, view_count), -1, dtype=torch.int64)
    put_at(seen, keys, views, views)
    for first, last in pieces(key_count, view_count):
        seen[first:last] = seen[first:last].cummax(1).values
    return seen


def followed(keys: Tensor, holds: Tensor, active: Collection[Hashable], key_count: int) -> Tensor:
    """Which rows' observations may change their key's episode.

    They are all rows of the keys that are ``active`` (in an episode or a streak) or that
    hold at some row of the flush. Any other row's observation is that its condition does
    not hold, of a key with no state: it changes nothing.
    """
    table = torch.zeros(key_count, dtype=torch.bool)
    if active:
        put(table, torch.tensor(list(active), dtype=torch.int64), True)  # the keys are ids
    holding = holds.nonzero().flatten()
    put(table, take(keys, holding), True)
    return take(table, keys)
