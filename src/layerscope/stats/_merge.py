"""Merging rows of partials, on the host in float64.

Means and M2 merge with the parallel form of Chan et al.'s update: with totals ``n = sum n_i``
and ``mean = sum n_i mean_i / n``, ``M2 = sum M2_i + sum n_i (mean_i - mean)**2``. Applied to
two rows it is exactly Chan's pairwise formula; applied to k rows at once it is the same sum
in one pass, so merging is exact up to float64 rounding whatever the grouping.
"""

from __future__ import annotations

import torch
from torch import Tensor

from layerscope.stats._layout import WIDTH, Field, Merge, merged_by

_ADDITIVE = merged_by(Merge.SUM)
_EXTREMES = {"amin": merged_by(Merge.MIN), "amax": merged_by(Merge.MAX)}


def merge_groups(rows: Tensor, group: Tensor, groups: int) -> Tensor:
    """Merge rows that share a group id.

    Args:
        rows: ``(n, WIDTH)`` float64 partials on the CPU.
        group: ``(n,)`` int64 group id of each row, in ``[0, groups)``.
        groups: number of groups.

    Returns:
        ``(groups, WIDTH)`` float64 merged partials.

    Examples:
        >>> from layerscope.stats import tensor_partials
        >>> a, _ = tensor_partials(torch.tensor([1.0, 2.0]), None)
        >>> b, _ = tensor_partials(torch.tensor([3.0]), None)
        >>> merged = merge_groups(torch.stack([a, b]), torch.tensor([0, 0]), 1)
        >>> merged[0, Field.MEAN].item(), merged[0, Field.M2].item()
        (2.0, 2.0)
    """
    rows = rows.to(torch.float64)
    out = torch.zeros(groups, WIDTH, dtype=torch.float64)
    for field in _ADDITIVE:
        out[:, field].index_add_(0, group, rows[:, field])

    count = rows[:, Field.COUNT]
    total = out[:, Field.COUNT]
    weighted = torch.zeros(groups, dtype=torch.float64).index_add_(
        0, group, count * rows[:, Field.MEAN]
    )
    mean = torch.where(total > 0, weighted / total.clamp(min=1.0), 0.0)
    spread = count * (rows[:, Field.MEAN] - mean[group]) ** 2
    m2 = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, rows[:, Field.M2] + spread)
    out[:, Field.MEAN] = mean
    out[:, Field.M2] = m2

    for reduce, fields in _EXTREMES.items():
        for field in fields:
            out[:, field] = torch.full((groups,), field.empty, dtype=torch.float64).scatter_reduce(
                0, group, rows[:, field], reduce=reduce
            )
    return out


def merge(a: Tensor, b: Tensor) -> Tensor:
    """Merge two rows of partials (Chan's pairwise formula).

    Examples:
        >>> from layerscope.stats import tensor_partials
        >>> x = torch.randn(100)
        >>> ab = merge(tensor_partials(x[:30], None)[0], tensor_partials(x[30:], None)[0])
        >>> torch.allclose(ab, tensor_partials(x, None)[0])
        True
    """
    return merge_groups(torch.stack([a.cpu(), b.cpu()]), torch.zeros(2, dtype=torch.int64), 1)[0]
