"""Statistics kernels: partials of a tensor, their merge, and their final form.

These are pure functions with no hooks, files or threads:

- ``tensor_partials(x, histogram)`` runs on ``x``'s device with no host sync and returns a
  float64 row of mergeable partials (``Field`` names its columns) and an int64 histogram;
- ``merge`` / ``merge_groups`` combine rows exactly (Chan's formula, float64, host);
- ``finalize`` turns rows into mean, std, min, max, absmax, l2, fractions and counts.

Examples:
    >>> import torch
    >>> from layerscope import stats
    >>> x = torch.tensor([1.0, 2.0, 3.0, float("inf")])
    >>> row, hist = stats.tensor_partials(x, stats.Log2Histogram())
    >>> out = stats.finalize(row[None])
    >>> out["mean"].item(), out["std"].item(), out["inf_count"].item()
    (2.0, 1.0, 1)
    >>> int(hist[127]), int(hist[128]), int(hist[255])  # [1, 2), [2, 4), non-finite
    (1, 2, 1)
"""

from layerscope.stats._finalize import BUILTIN_STATS, finalize
from layerscope.stats._histogram import (
    LOG2_BINS,
    HistogramSpec,
    LinearHistogram,
    Log2Histogram,
    log2_bin_edges,
)
from layerscope.stats._layout import Field
from layerscope.stats._merge import merge, merge_groups
from layerscope.stats._partials import tensor_partials
from layerscope.stats._selection import CustomStat

# What a user computing statistics by hand, or writing a sink or a custom statistic, needs;
# the parsers of watch()'s arguments and the row's width stay in their modules.
__all__ = [
    "BUILTIN_STATS",
    "LOG2_BINS",
    "CustomStat",
    "Field",
    "HistogramSpec",
    "LinearHistogram",
    "Log2Histogram",
    "finalize",
    "log2_bin_edges",
    "merge",
    "merge_groups",
    "tensor_partials",
]
