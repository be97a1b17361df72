"""Finalising merged partials into the statistics a person reads."""

from __future__ import annotations

import torch
from torch import Tensor

from layerscope.stats._layout import Field


def finalize(rows: Tensor) -> dict[str, Tensor]:
    """Statistics of each row of merged partials.

    Moments, extremes and norms cover the finite elements; they are NaN where a tensor has none
    (empty, all non-finite, or a counts-only dtype). ``std`` is the unbiased sample standard
    deviation, as ``torch.std``, and NaN below two finite elements. Fractions are of ``numel``.

    Args:
        rows: ``(n, WIDTH)`` float64 partials on the CPU.

    Returns:
        One ``(n,)`` tensor per statistic: ``numel``, ``nan_count`` and ``inf_count`` int64, the
        rest float64.

    Examples:
        >>> from layerscope.stats import tensor_partials
        >>> row, _ = tensor_partials(torch.tensor([3.0, -4.0, 0.0]), None)
        >>> out = finalize(row[None])
        >>> round(out["l2"].item(), 6), out["absmax"].item(), round(out["zero_frac"].item(), 4)
        (5.0, 4.0, 0.3333)
    """
    rows = rows.to(torch.float64)
    nan = torch.tensor(torch.nan, dtype=torch.float64)
    numel = rows[:, Field.NUMEL]
    count = rows[:, Field.COUNT]
    has_values = count > 0
    mean = torch.where(has_values, rows[:, Field.MEAN], nan)
    m2 = rows[:, Field.M2]
    std = torch.where(count > 1, (m2 / (count - 1).clamp(min=1.0)).sqrt(), nan)
    low = torch.where(has_values, rows[:, Field.MIN], nan)
    high = torch.where(has_values, rows[:, Field.MAX], nan)
    per_element = numel.clamp(min=1.0)
    has_elements = numel > 0
    return {
        "numel": numel.to(torch.int64),
        "mean": mean,
        "std": std,
        "min": low,
        "max": high,
        "absmax": torch.maximum(low.abs(), high.abs()),
        # Both terms are non-negative, so there is no cancellation.
        "l2": torch.where(has_values, (m2 + count * rows[:, Field.MEAN] ** 2).sqrt(), nan),
        "zero_frac": torch.where(has_elements, rows[:, Field.ZEROS] / per_element, nan),
        "neg_frac": torch.where(has_elements, rows[:, Field.NEG] / per_element, nan),
        "pos_frac": torch.where(has_elements, rows[:, Field.POS] / per_element, nan),
        "nan_count": rows[:, Field.NAN].to(torch.int64),
        "inf_count": rows[:, Field.INF].to(torch.int64),
    }
