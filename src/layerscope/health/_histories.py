"""The recent scales of each layer, kept as rings of tensors, and which of them jumped.

``loss_spike`` names the layers whose scale moved first before a spike: it keeps the last
``HISTORY`` recorded scales of each (module, kind, tensor), appended a flush at a time, and
reads them only when the loss spikes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from layerscope.health._keyed import earlier
from layerscope.health._small_ops import pieces, put_at, take

HISTORY = 64  # recorded steps of each layer's scale kept (a power of two: rings wrap by a mask)
LOOKBACK = 5  # recorded steps before a step that say what its scale usually is
MOVED = 3.0  # a layer has moved when its scale is this many times off its usual one


class Histories:
    """Each key's last ``HISTORY`` (step, scale) pairs, in a ring; keys in the order first seen."""

    def __init__(self) -> None:
        self._count = torch.zeros(0, dtype=torch.int64)  # appended so far, by key
        self._steps = torch.zeros((0, HISTORY), dtype=torch.int64)
        self._scales = torch.zeros((0, HISTORY), dtype=torch.float64)
        self._first_seen: list[int] = []  # the keys, in the order first appended

    def append(
        self,
        keys: Tensor,
        views: Tensor,
        steps: Tensor,
        scales: Tensor,
        view_count: int,
        key_count: int,
    ) -> None:
        """Append rows (one per key and view at most), view by view."""
        self._grow(key_count)
        if not len(keys):
            return
        counts = torch.bincount(keys, minlength=key_count)
        new = ((self._count == 0) & (counts > 0)).nonzero().flatten()
        if len(new):  # first seen in the order of their first rows, view by view
            first = torch.full((key_count,), len(keys) * (view_count + 1), dtype=torch.int64)
            first.scatter_reduce_(0, keys, views * len(keys) + torch.arange(len(keys)), "amin")
            self._first_seen += take(new, take(first, new).argsort()).tolist()
        nth = earlier(views, keys, view_count, key_count)
        # A key's last HISTORY rows of the flush, each at its place in the key's ring.
        kept = (nth >= take(counts, keys) - HISTORY).nonzero().flatten()
        place = take((take(self._count, keys) + nth) & (HISTORY - 1), kept)
        put_at(self._steps, take(keys, kept), place, take(steps, kept))
        put_at(self._scales, take(keys, kept), place, take(scales, kept))
        self._count += counts

    def _grow(self, size: int) -> None:
        more = size - len(self._count)
        if more > 0:
            self._count = torch.cat([self._count, torch.zeros(more, dtype=torch.int64)])
            self._steps = torch.cat([self._steps, torch.zeros((more, HISTORY), dtype=torch.int64)])
            blank = torch.zeros((more, HISTORY), dtype=torch.float64)
            self._scales = torch.cat([self._scales, blank])

    def moved(self, step: int, window: int) -> list[tuple[int, int, float]]:
        """The keys whose scale jumped in the ``window`` steps up to ``step``: (key, at, -|log|).

        A jump is a recorded step whose scale is ``MOVED`` times off the median of the few
        recorded steps before it: a change, not the slow drift of training. Each key's first
        jump in the window, keys in the order first seen.
        """
        keys = torch.tensor(self._first_seen, dtype=torch.int64)
        moved = []
        for first, last in pieces(len(keys), HISTORY * LOOKBACK):
            moved += self._moved(keys[first:last], step, window, first)
        return moved

    def moved_since(self, since: tuple[int, int], step: int) -> list[tuple[int, int, float]]:
        """The keys whose scale moved from ``since`` to ``step``: (key, at, -|log|).

        ``since`` is a span of steps (first, last: where the loss was at its low); a key's
        scale there is the median of its recorded scales in it, or where it has none there,
        its last recorded scale before. A key has moved at the first recorded step after the
        span, up to ``step``, whose scale is ``MOVED`` times off that: a climb over several
        steps, which no single step's jump shows. Keys in the order first seen.
        """
        keys = torch.tensor(self._first_seen, dtype=torch.int64)
        moved = []
        for first, last in pieces(len(keys), HISTORY * 4):
            moved += self._moved_since(keys[first:last], since, step, first)
        return moved

    def _ordered(self, keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each of ``keys``' (steps, scales) oldest first, and how many of them it holds."""
        count = take(self._count, keys)
        held = count.clamp(max=HISTORY)
        # Index i is the ring's place (count - held + i).
        places = ((count - held)[:, None] + torch.arange(HISTORY)) & (HISTORY - 1)
        steps = take(self._steps, keys).gather(1, places)
        scales = take(self._scales, keys).gather(1, places)
        return steps, scales, held

    def _moved_since(
        self, keys: Tensor, since: tuple[int, int], step: int, offset: int
    ) -> list[tuple[int, int, float]]:
        """``moved_since`` of some keys, the ``offset``-th first seen onwards."""
        steps, scales, held = self._ordered(keys)
        index = torch.arange(HISTORY)
        kept = index < held[:, None]
        inside = kept & (steps >= since[0]) & (steps <= since[1])
        spanned = inside.sum(1)
        in_span = _medians(
            torch.where(inside, scales, math.inf).sort(dim=1).values, spanned.clamp(min=1)
        )
        before = torch.where(kept & (steps < since[0]), index, -1).max(dim=1).values
        last_before = scales.gather(1, before.clamp(min=0)[:, None]).squeeze(1)
        usual = torch.where(spanned > 0, in_span, torch.where(before >= 0, last_before, math.nan))[
            :, None
        ]
        after = kept & (steps > since[1]) & (steps <= step)
        off = after & ((scales / usual > MOVED) | (usual / scales > MOVED))
        at = torch.where(off, index, HISTORY).min(dim=1).values
        found = (at < HISTORY).nonzero().flatten()
        if not len(found):
            return []
        at = take(at, found)
        moved_at = steps[found, at].tolist()
        logs = (scales[found, at] / take(usual.squeeze(1), found)).log().abs().tolist()
        return [
            (self._first_seen[offset + key], int(where), -size)
            for key, where, size in zip(found.tolist(), moved_at, logs, strict=True)
        ]

    def _moved(
        self, keys: Tensor, step: int, window: int, offset: int
    ) -> list[tuple[int, int, float]]:
        """``moved`` of some keys, the ``offset``-th first seen onwards."""
        steps, scales, held = self._ordered(keys)
        index = torch.arange(HISTORY)
        candidates = (
            (index >= 2) & (index < held[:, None]) & (steps > step - window) & (steps <= step)
        )
        which, at = candidates.nonzero().unbind(1)
        if not len(which):
            return []
        # The usual scale: the median of up to LOOKBACK pairs before.
        behind = at[:, None] - torch.arange(LOOKBACK, 0, -1)  # (candidates, LOOKBACK)
        known = behind >= 0
        flat = (which[:, None] * HISTORY + behind.clamp(min=0)).reshape(-1)
        before = torch.where(known, take(scales.reshape(-1), flat).reshape(behind.shape), math.inf)
        usual = _medians(before.sort(dim=1).values, known.sum(1))
        scale = take(scales.reshape(-1), which * HISTORY + at)
        jumped = ((scale / usual > MOVED) | (usual / scale > MOVED)).nonzero().flatten()
        columns = [take(column, jumped).tolist() for column in (which, at, scale, usual)]
        first: dict[int, tuple[int, float, float]] = {}
        for key, place, value, typical in zip(*columns, strict=True):
            first.setdefault(key, (place, value, typical))
        return [
            (
                self._first_seen[offset + key],
                int(steps[key, place]),
                -abs(math.log(value / typical)),
            )
            for key, (place, value, typical) in sorted(first.items())
        ]


def _medians(ordered: Tensor, counts: Tensor) -> Tensor:
    """The median of each row's first ``counts`` values (sorted), as ``statistics.median``."""
    middle = (counts >> 1)[:, None]
    upper = ordered.gather(1, middle).squeeze(1)
    lower = ordered.gather(1, (middle - 1).clamp(min=0)).squeeze(1)
    return torch.where(counts & 1 == 1, upper, (lower + upper) / 2)


class RecentScales:
    """Each key's last ``size`` scales, in a ring, and the median of them: its usual scale.

    The gradient rules judge a layer's gradient against its own recent past as well as against
    the layers after it: a scale far above its usual one has grown.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._count = torch.zeros(0, dtype=torch.int64)  # appended so far, by key
        self._scales = torch.zeros((0, size), dtype=torch.float64)

    def usual(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Each key's median of its held scales (NaN where none), and how many it holds."""
        self._grow(int(keys.max()) + 1 if len(keys) else 0)
        held = take(self._count, keys).clamp(max=self.size)
        present = torch.arange(self.size) < held[:, None]
        scales = torch.where(present, take(self._scales, keys), math.inf)
        usual = _medians(scales.sort(dim=1).values, held.clamp(min=1))
        return torch.where(held > 0, usual, math.nan), held

    def last(self, keys: Tensor) -> Tensor:
        """Each key's latest scale (NaN where none)."""
        self._grow(int(keys.max()) + 1 if len(keys) else 0)
        count = take(self._count, keys)
        place = ((count - 1) % self.size).unsqueeze(1)
        latest = take(self._scales, keys).gather(1, place).squeeze(1)
        return torch.where(count > 0, latest, math.nan)

    def append(self, keys: Tensor, scales: Tensor) -> None:
        """Append one scale to each of ``keys`` (distinct)."""
        self._grow(int(keys.max()) + 1 if len(keys) else 0)
        place = take(self._count, keys) % self.size
        put_at(self._scales, keys, place, scales)
        self._count.index_add_(0, keys, torch.ones_like(keys))

    def _grow(self, size: int) -> None:
        more = size - len(self._count)
        if more > 0:
            self._count = torch.cat([self._count, torch.zeros(more, dtype=torch.int64)])
            blank = torch.zeros((more, self.size), dtype=torch.float64)
            self._scales = torch.cat([self._scales, blank])
