"""The median scale of the layers after each layer, bounded for all and exact for a few.

The gradient rules compare a layer's gradient with the median of those after it in forward
order, at each step: a median of a different set for each layer. Bounds come for all layers
at once from counts by power of two: the median lies in the binade where the counts of the
layers after reach half their number, so it is at least that binade's bottom and below its
top. Only the layers whose bounds leave a threshold possibly crossed (or whose episode is
open) need the exact median, which a sorted copy of the layers after gives.
"""

from __future__ import annotations

import bisect
import math

import torch
from torch import Tensor

from layerscope.health._small_ops import pieces, take

_BINADES = 48  # the powers of two told apart; smaller scales go into the bottom one


def median_bounds(scales: Tensor, position: Tensor, size: Tensor) -> tuple[Tensor, Tensor]:
    """``(low, high)``: bounds on the median of the scales after each one in its group.

    ``scales`` (above zero) come group by group, each in order; ``position`` is each one's
    place in its group, of ``size``. Where fewer than two come after there is no median to
    compare with: NaN.
    """
    rows = len(scales)
    if not rows:
        return scales, scales
    _, exponent = torch.frexp(scales)  # a scale is in [2**(exponent-1), 2**exponent)
    exponent = exponent.long()
    finite = torch.isfinite(scales)
    top = int(torch.where(finite, exponent, torch.iinfo(torch.int64).min).max())
    least = int(torch.where(finite, exponent, torch.iinfo(torch.int64).max).min())
    if not bool(finite.any()):
        top = least = 0
    bottom = max(least, top - _BINADES + 1)
    span = top - bottom + 1  # and one more binade for infinite scales, if any
    binade = torch.where(finite, exponent - bottom, span).clamp_(min=0)
    # By row: how many rows after it in its group are in each binade or below: the counts up
    # to its group's end (from a histogram) less those up to it (piece by piece).
    end = torch.arange(rows) - position + size - 1
    binades = torch.arange(span + 1)
    ends, group = _counts_through(binade, end, span + 1)
    count = size - 1 - position
    half = count // 2
    upper = torch.empty(rows, dtype=torch.int64)
    lower = torch.empty(rows, dtype=torch.int64)
    carried = torch.zeros(span + 1, dtype=torch.int64)
    for first, last in pieces(rows, span + 1):
        through = (binade[first:last, None] <= binades).cumsum(0) + carried
        carried = through[-1]
        after = take(ends, group[first:last]) - through
        # The median is the half-th smallest of those after, or with an even count the mean
        # of it and the one before: each lies in the first binade whose count passes its rank.
        wanted = half[first:last, None]
        upper[first:last] = (after <= wanted).sum(1)
        lower[first:last] = (after <= wanted - 1).sum(1)
    lower = torch.where(count & 1 == 0, lower, upper)
    one = torch.ones(rows, dtype=torch.float64)
    low = torch.ldexp(one, bottom + lower - 1)
    if least < bottom:  # the bottom binade holds all that are below too
        low = torch.where(lower == 0, 0.0, low)
    high = torch.where(upper >= span, math.inf, torch.ldexp(one, bottom + upper))
    few = count < 2
    return torch.where(few, math.nan, low), torch.where(few, math.nan, high)


def _counts_through(binade: Tensor, end: Tensor, binades: int) -> tuple[Tensor, Tensor]:
    """By group, how many rows up to its end are in each binade or below; each row's group."""
    ends, group = torch.unique_consecutive(end, return_inverse=True)
    histogram = torch.bincount(group * binades + binade, minlength=len(ends) * binades)
    return histogram.reshape(len(ends), binades).cumsum(1).cumsum(0), group


def medians_after(scales: list[float], positions: list[int]) -> dict[int, tuple[float, float]]:
    """The two middle values of ``scales`` after each of ``positions``; NaN with fewer than two.

    An odd count's middle value comes twice. Of an even count the rules take the middle value
    nearer the layer's own scale: the lower to call it vanishing, the upper to call it
    exploding. Where the layers after it are of two branches (a decoder's last layer and an
    auxiliary head), the mean of the middle two is the larger branch's, not its own's.
    """
    if len(positions) > 8:  # many: one walk from the last layer, keeping the scales sorted
        medians: dict[int, tuple[float, float]] = {}
        after: list[float] = []
        wanted = set(positions)
        for position in range(len(scales) - 1, -1, -1):
            if position in wanted:
                medians[position] = _middles(after)
            bisect.insort(after, scales[position])
        return medians
    return {position: _middles(sorted(scales[position + 1 :])) for position in positions}


def _middles(ordered: list[float]) -> tuple[float, float]:
    if len(ordered) < 2:
        return math.nan, math.nan
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle], ordered[middle]
    return ordered[middle - 1], ordered[middle]
