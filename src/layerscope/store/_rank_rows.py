"""Merging the ranks' rows of a stored run into whole-job rows: ``load(path, ranks="merge")``.

The stored statistics are enough to merge exactly (up to float64 rounding): the finite count is
``numel - nan_count - inf_count``, ``M2 = std**2 (count - 1)``, and means, M2, extremes, counts,
fractions, L2 norms, histograms and custom statistics merge as the live merge does (see
``layerscope.writer._rank_merge``). Forward and backward kinds merge over ranks; a parameter kind
merges only where it was sharded (its rows have a ``shard``), and is the lowest rank's
otherwise, as a replicated parameter is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.model import IDENTITY_COLUMNS, STATE_KINDS
from layerscope.stats import FORMATS, PRECISION_COUNTS, scale_exponent

if TYPE_CHECKING:
    import pandas

_GROUP = ["step", *IDENTITY_COLUMNS, "sentinel"]
_FRACTIONS = ("zero_frac", "neg_frac", "pos_frac")
_NONFINITE = ("nan_count", "inf_count")
_COUNTS = (*_NONFINITE, *PRECISION_COUNTS)
_STATE_KINDS = frozenset(kind.value for kind in STATE_KINDS)


def merge_rank_rows(
    frame: pandas.DataFrame,
    shapes: Mapping[tuple[str, str], tuple[int, ...]],
    custom: tuple[str, ...] = (),
) -> pandas.DataFrame:
    """The rows of ``frame`` (a run's ``stats``, histograms widened) merged across ranks.

    Args:
        frame: one row per step, phase, rank, module, kind, tensor and call.
        shapes: each ``(module, parameter)``'s whole shape, for merged shards' rows.
        custom: the names of custom statistics (numel-weighted means).

    Returns:
        One row per step, phase, module, kind, tensor and call, with ``rank`` 0, in the
        order of the lowest rank's rows.
    """
    import pandas as pd

    if frame.empty or frame["rank"].nunique() < 2:
        return frame
    sentinel = frame["sentinel"].fillna(False).astype(bool)
    replicated = frame["kind"].isin(_STATE_KINDS) & frame["shard"].isna()
    lowest = frame["rank"] == frame["rank"].min()
    # A replicated parameter's row is the lowest rank's: the other ranks' copies are dropped.
    frame = frame[~replicated | lowest].assign(sentinel=sentinel[~replicated | lowest])
    keys = frame[_GROUP].astype(object).where(frame[_GROUP].notna(), None)
    codes = _group_codes(keys)
    groups = int(codes.max()) + 1
    first = np.full(groups, -1)
    first[codes[::-1]] = np.arange(len(codes))[::-1]
    merged = frame.iloc[first].copy().reset_index(drop=True)
    merged["rank"] = 0
    _merge_moments(frame, codes, groups, merged)
    for name in ("min",):
        merged[name] = _reduce(frame[name], codes, groups, np.fmin, np.inf)
    for name in ("max", "absmax"):
        if name in frame:
            merged[name] = _reduce(frame[name], codes, groups, np.fmax, -np.inf)
    if "l2" in frame:
        squares = _numbers(frame["l2"]) ** 2
        merged["l2"] = np.sqrt(_sum(squares, codes, groups))
    numel = _numbers(frame["numel"])
    total = np.bincount(codes, weights=numel, minlength=groups)
    for name in _FRACTIONS:
        if name in frame:
            weighted = _sum(_numbers(frame[name]) * numel, codes, groups)
            merged[name] = np.where(total > 0, weighted / np.maximum(total, 1), np.nan)
    for name in (*_COUNTS, "numel"):
        if name in frame:
            summed = _sum(_numbers(frame[name]), codes, groups)
            merged[name] = pd.array(np.round(summed), dtype="Int64")
    for fmt in FORMATS:  # the power of two that fits the merged absmax
        if fmt.scale_exp in frame and "absmax" in frame:
            merged[fmt.scale_exp] = [scale_exponent(v, fmt) for v in _numbers(merged["absmax"])]
    for name in custom:
        if name in frame:
            merged[name] = _weighted_custom(frame[name], numel, codes, groups)
    if "hist" in frame:
        merged["hist"] = _histograms(frame["hist"], codes, groups)
    sharded = merged["shard"].notna()
    if sharded.any():
        columns = merged.loc[sharded, ["module", "tensor", "shape"]]
        merged.loc[sharded, "shape"] = pd.Series(
            [
                shapes.get((module, tensor), shape)
                for module, tensor, shape in columns.itertuples(index=False)
            ],
            index=columns.index,
            dtype=object,
        )
        merged.loc[sharded, "shard"] = None
    return merged


def _group_codes(keys: pandas.DataFrame) -> np.ndarray:
    """A group number per row, numbered in order of first appearance."""
    seen: dict[tuple[Any, ...], int] = {}
    return np.array(
        [seen.setdefault(key, len(seen)) for key in keys.itertuples(index=False, name=None)]
    )


def _numbers(column: pandas.Series) -> np.ndarray:
    values: np.ndarray = column.to_numpy(dtype=np.float64, na_value=np.nan)
    return values


def _sum(values: np.ndarray, codes: np.ndarray, groups: int) -> np.ndarray:
    """Per group the sum of the values present; NaN where a group has none."""
    present = ~np.isnan(values)
    sums = np.bincount(codes[present], weights=values[present], minlength=groups)
    counted = np.bincount(codes[present], minlength=groups)
    return np.where(counted > 0, sums, np.nan)


def _reduce(
    column: pandas.Series, codes: np.ndarray, groups: int, ufunc: Any, empty: float
) -> np.ndarray:
    values = _numbers(column)
    out = np.full(groups, empty)
    ufunc.at(out, codes, np.where(np.isnan(values), empty, values))
    return np.where(np.isinf(out) & (out == empty), np.nan, out)


def _merge_moments(
    frame: pandas.DataFrame, codes: np.ndarray, groups: int, merged: pandas.DataFrame
) -> None:
    """Mean and std of the finite elements, merged with Chan et al.'s parallel formula."""
    if "mean" not in frame:
        return
    finite = _numbers(frame["numel"])
    for name in _NONFINITE:
        if name in frame:
            finite = finite - np.nan_to_num(_numbers(frame[name]))
    mean = _numbers(frame["mean"])
    counted = np.where(np.isnan(mean), 0.0, finite)
    mean = np.nan_to_num(mean)
    n = np.bincount(codes, weights=counted, minlength=groups)
    merged_mean = np.bincount(codes, weights=counted * mean, minlength=groups) / np.maximum(n, 1)
    merged["mean"] = np.where(n > 0, merged_mean, np.nan)
    if "std" not in frame:
        return
    std = np.nan_to_num(_numbers(frame["std"]))
    m2 = std**2 * np.maximum(counted - 1, 0) + counted * (mean - merged_mean[codes]) ** 2
    total = np.bincount(codes, weights=m2, minlength=groups)
    merged["std"] = np.where(n > 1, np.sqrt(total / np.maximum(n - 1, 1)), np.nan)


def _weighted_custom(
    column: pandas.Series, numel: np.ndarray, codes: np.ndarray, groups: int
) -> list[Any]:
    """A custom statistic's numel-weighted mean over ranks; None where lengths disagree."""
    totals: list[Any] = [None] * groups
    weights = np.zeros(groups)
    scalar = [True] * groups
    for code, value, weight in zip(codes, column, numel, strict=True):
        if value is None or (isinstance(value, float) and np.isnan(value)):
            continue
        weight = max(float(weight), 1.0)
        values = np.atleast_1d(np.asarray(value, dtype=np.float64)) * weight
        total = totals[code]
        if total is False or (total is not None and total.shape != values.shape):
            totals[code] = False
            continue
        totals[code] = values if total is None else total + values
        weights[code] += weight
        scalar[code] = np.ndim(value) == 0
    out: list[Any] = []
    for total, weight, is_scalar in zip(totals, weights, scalar, strict=True):
        if total is None or total is False:
            out.append(None)
        elif is_scalar:
            out.append(float(total[0] / weight))
        else:
            out.append([float(v) for v in total / weight])
    return out


def _histograms(column: pandas.Series, codes: np.ndarray, groups: int) -> list[Any]:
    totals: list[Any] = [None] * groups
    for code, counts in zip(codes, column, strict=True):
        if counts is None:
            continue
        totals[code] = counts.copy() if totals[code] is None else totals[code] + counts
    return totals
