"""Finalising merged partials into the statistics a person reads."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from layerscope.stats._formats import FORMATS
from layerscope.stats._layout import Field


def finalize(rows: Tensor) -> dict[str, Tensor]:
    """Statistics of each row of merged partials.

    Moments, extremes and norms cover the finite elements; they are NaN where a tensor has none
    (empty, all non-finite, or a counts-only dtype). ``std`` is the unbiased sample standard
    deviation, as ``torch.std``, and NaN below two finite elements. Fractions are of ``numel``.
    Per low-precision format (``_formats``): the counts ``{fmt}_over`` and ``{fmt}_under``, and
    ``{fmt}_scale_exp``, the largest k with ``absmax * 2**k <= max``, NaN where absmax is.

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
    absmax = torch.maximum(low.abs(), high.abs())
    return {
        "numel": numel.to(torch.int64),
        "mean": mean,
        "std": std,
        "min": low,
        "max": high,
        "absmax": absmax,
        # Both terms are non-negative, so there is no cancellation.
        "l2": torch.where(has_values, (m2 + count * rows[:, Field.MEAN] ** 2).sqrt(), nan),
        "zero_frac": torch.where(has_elements, rows[:, Field.ZEROS] / per_element, nan),
        "neg_frac": torch.where(has_elements, rows[:, Field.NEG] / per_element, nan),
        "pos_frac": torch.where(has_elements, rows[:, Field.POS] / per_element, nan),
        "nan_count": rows[:, Field.NAN].to(torch.int64),
        "inf_count": rows[:, Field.INF].to(torch.int64),
        **_headroom(rows, absmax),
    }


def _headroom(rows: Tensor, absmax: Tensor) -> dict[str, Tensor]:
    """Each format's counts, and the power of two that fits absmax into it."""
    # absmax = m * 2**e with m in [0.5, 1): absmax * 2**k <= max = M * 2**E where k <= E - e,
    # less one where m > M. Exact: no value is rounded.
    mantissa, exponent = torch.frexp(absmax)
    usable = (absmax > 0) & (absmax < math.inf)  # NaN compares false
    out: dict[str, Tensor] = {}
    for fmt in FORMATS:
        top_mantissa, top_exponent = math.frexp(fmt.max)
        scale = top_exponent - exponent - (mantissa > top_mantissa).to(torch.int32)
        out[fmt.over] = rows[:, Field[fmt.over.upper()]].to(torch.int64)
        out[fmt.under] = rows[:, Field[fmt.under.upper()]].to(torch.int64)
        out[fmt.scale_exp] = torch.where(usable, scale.to(torch.float64), math.nan)
    return out
