"""The typical parameter gradient of each step: the median of their scales."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from layerscope.health._readings import Flush
from layerscope.health._small_ops import counts_by, take


def typical_scales(flush: Flush, grads: Tensor) -> Tensor:
    """``(views,)``: each view's median scale of its finite ``grads`` rows above zero.

    Taken as ``statistics.median`` takes it; NaN for a view with none.
    """
    kept = grads & ~flush.nonfinite & (flush.rms > 0)
    at = kept.nonzero().flatten()
    scales, views = take(flush.rms, at), take(flush.view, at)
    # Sorted by scale, then (stably) by view: each view's scales in a run, in order.
    by_scale = scales.argsort()
    by_view = take(views, by_scale).argsort(stable=True)
    ordered = take(take(scales, by_scale), by_view)
    count = counts_by(flush.view, kept, len(flush.views))
    start = count.cumsum(0) - count
    middle = (start + count // 2).clamp(max=max(len(ordered) - 1, 0))
    if not len(ordered):
        return torch.full((len(flush.views),), math.nan, dtype=torch.float64)
    upper = take(ordered, middle)
    lower = take(ordered, (middle - 1).clamp(min=0))
    median = torch.where(count & 1 == 1, upper, (lower + upper) / 2)
    return torch.where(count > 0, median, math.nan)
