"""finalize: rows of partials (built here by numpy) into the statistics a person reads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_reference import (
    SETTINGS,
    check_stats,
    counts_only,
    reference_row,
    reference_stats,
    row_stats,
    tensors,
    values_of,
)

from layerscope.stats import BUILTIN_STATS, PRECISION_COUNTS, Field, finalize
from layerscope.stats._layout import WIDTH

NAN = math.nan
_KEYS = {"numel", *BUILTIN_STATS} - {"hist"}
_INT_KEYS = {"numel", "nan_count", "inf_count", *PRECISION_COUNTS}


def finalize_one(a: np.ndarray, only_counts: bool = False) -> dict[str, float]:
    rows = torch.from_numpy(reference_row(np.asarray(a, dtype=np.float64), only_counts)[None])
    return row_stats(finalize(rows), 0)


@settings(SETTINGS, max_examples=100)
@given(xs=st.lists(tensors(), min_size=1, max_size=5))
def test_finalize_matches_numpy(xs: list[torch.Tensor]) -> None:
    # Exact float64 rows in, so only finalize's own float64 arithmetic is left.
    values = [values_of(x) for x in xs]
    rows = np.stack([reference_row(a, counts_only(x)) for a, x in zip(values, xs, strict=True)])
    out = finalize(torch.from_numpy(rows))
    assert set(out) == _KEYS
    for key, column in out.items():
        assert column.shape == (len(xs),)
        assert column.dtype == (torch.int64 if key in _INT_KEYS else torch.float64), key
    for i, (a, x) in enumerate(zip(values, xs, strict=True)):
        check_stats(row_stats(out, i), reference_stats(a, counts_only(x)), float64=True)


def _expect(got: dict[str, float], **want: float) -> None:
    for key, value in want.items():
        assert (math.isnan(got[key]) and math.isnan(value)) or got[key] == value, (key, got)


def test_empty_row() -> None:
    got = finalize_one(np.empty(0))
    _expect(got, numel=0, nan_count=0, inf_count=0)
    for key in _KEYS - _INT_KEYS:
        assert math.isnan(got[key]), key  # no elements: no fractions either


def test_only_nonfinite_row() -> None:
    got = finalize_one(np.array([NAN, NAN, math.inf]))
    _expect(got, numel=3, nan_count=2, inf_count=1, zero_frac=0.0, neg_frac=0.0)
    _expect(got, pos_frac=1 / 3)
    for key in ("mean", "std", "min", "max", "absmax", "l2"):
        assert math.isnan(got[key]), key


def test_single_value_has_no_std() -> None:
    got = finalize_one(np.array([-2.5, NAN]))
    _expect(got, mean=-2.5, std=NAN, min=-2.5, max=-2.5, absmax=2.5, l2=2.5)
    _expect(got, zero_frac=0.0, neg_frac=0.5, pos_frac=0.0, nan_count=1, numel=2)


def test_two_values_std_is_unbiased() -> None:
    got = finalize_one(np.array([1.0, 3.0, -math.inf]))
    assert got["std"] == pytest.approx(math.sqrt(2.0), rel=1e-15)  # not the biased 1.0
    _expect(got, mean=2.0, min=1.0, max=3.0, absmax=3.0, inf_count=1, neg_frac=1 / 3)


def test_absmax_takes_the_negative_side() -> None:
    got = finalize_one(np.array([-5.0, 3.0, 0.0]))
    _expect(got, absmax=5.0, zero_frac=1 / 3)
    assert got["l2"] == pytest.approx(math.sqrt(34.0), rel=1e-15)


def test_counts_only_row() -> None:
    got = finalize_one(np.array([0, -1, 2, 0, 7]), only_counts=True)
    _expect(got, numel=5, zero_frac=0.4, neg_frac=0.2, pos_frac=0.4, nan_count=0, inf_count=0)
    for key in ("mean", "std", "min", "max", "absmax", "l2"):
        assert math.isnan(got[key]), key


@pytest.mark.parametrize("loc", [1e8, -1e12])
def test_l2_of_a_large_mean_with_small_spread(loc: float) -> None:
    a = loc + np.arange(-3.0, 4.0)
    got = finalize_one(a)
    assert got["l2"] == pytest.approx(math.sqrt(np.sum(a * a)), rel=1e-15)
    assert got["std"] == pytest.approx(np.std(a, ddof=1), rel=1e-12)


def test_rows_are_independent() -> None:
    a, b = np.array([1.0, 2.0, 4.0]), np.array([NAN])
    both = finalize(torch.from_numpy(np.stack([reference_row(a), reference_row(b)])))
    alone = finalize_one(a)
    assert row_stats(both, 0) == alone
    assert both["nan_count"].tolist() == [0, 1]


def test_float32_rows_are_read_as_float64() -> None:
    row = np.zeros(WIDTH)
    fields = {Field.NUMEL: 2, Field.COUNT: 2, Field.MEAN: 1.5, Field.M2: 0.5, Field.POS: 2}
    for field, value in {**fields, Field.MIN: 1.0, Field.MAX: 2.0}.items():
        row[field] = value
    got = row_stats(finalize(torch.from_numpy(row[None]).float()), 0)
    _expect(got, mean=1.5, min=1.0, max=2.0, pos_frac=1.0, numel=2)
    assert got["std"] == pytest.approx(math.sqrt(0.5), rel=1e-15)
