"""merge / merge_groups: partials of pieces combine into the statistics of the whole."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_reference import (
    ALL_DTYPES,
    EXACT_FIELDS,
    FLOAT_DTYPES,
    SETTINGS,
    check_stats,
    counts_only,
    reference_row,
    reference_stats,
    row_stats,
    tensors,
    values_of,
)

from layerscope.stats import Field, finalize, merge, merge_groups, tensor_partials
from layerscope.stats._layout import WIDTH


@st.composite
def split(
    draw: st.DrawFn,
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES,
    min_pieces: int = 1,
    max_pieces: int = 6,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A tensor and its flat values cut into pieces, empty pieces included."""
    x = draw(tensors(dtypes))
    flat = x.reshape(-1)
    k = draw(st.integers(min_pieces, max_pieces))
    cuts = sorted(draw(st.lists(st.integers(0, flat.numel()), min_size=k - 1, max_size=k - 1)))
    bounds = [0, *cuts, flat.numel()]
    return x, [flat[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def partials(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([tensor_partials(p, None)[0] for p in pieces])


def assert_merged_exactly(got: torch.Tensor, a: np.ndarray, only_counts: bool) -> None:
    """Counts and extremes of a merged row against numpy on the whole: exact."""
    want = reference_row(a, only_counts)
    for field in EXACT_FIELDS:
        assert got[field].item() == want[field], field.name


def assert_merged_float64(got: torch.Tensor, a: np.ndarray) -> None:
    """A merge of exact float64 rows against numpy on the whole.

    mean = sum(n_i mean_i) / n: each product and the k-term sum round once, <= 1e-14 * A.
    M2 = sum(M2_i + n_i (mean_i - mean)**2) adds non-negative terms (relative 1e-12); each
    mean_i carries numpy's own rounding ~eps * A, which moves the spread term by
    ~2 n_i |mean_i - mean| eps A, in all <= 1e-14 * A * sum|v - mean|.
    """
    assert_merged_exactly(got, a, False)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        assert (got[Field.MEAN].item(), got[Field.M2].item()) == (0.0, 0.0)
        return
    scale = np.abs(finite).max()
    mean = finite.mean()
    m2 = np.sum((finite - mean) ** 2)
    spread = np.abs(finite - mean).sum()
    assert abs(got[Field.MEAN].item() - mean) <= 1e-14 * scale
    assert abs(got[Field.M2].item() - m2) <= 1e-12 * m2 + 1e-14 * scale * spread


@settings(SETTINGS, max_examples=250)
@given(case=split())
def test_merge_groups_of_pieces_is_the_whole(case: tuple[torch.Tensor, list[torch.Tensor]]):
    x, pieces = case
    merged = merge_groups(partials(pieces), torch.zeros(len(pieces), dtype=torch.int64), 1)
    assert merged.shape == (1, WIDTH)
    assert merged.dtype == torch.float64
    a = values_of(x)
    assert_merged_exactly(merged[0], a, counts_only(x))
    check_stats(
        row_stats(finalize(merged), 0),
        reference_stats(a, counts_only(x)),
        float64=x.dtype == torch.float64,
        slack=2.0,  # each piece rounds on its own, see check_stats
    )


@settings(SETTINGS, max_examples=150)
@given(case=split(min_pieces=2, max_pieces=2))
def test_pairwise_merge_is_the_whole(case: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    x, pieces = case
    merged = merge(*partials(pieces))
    assert merged.shape == (WIDTH,)
    a = values_of(x)
    assert_merged_exactly(merged, a, counts_only(x))
    check_stats(
        row_stats(finalize(merged[None]), 0),
        reference_stats(a, counts_only(x)),
        float64=x.dtype == torch.float64,
        slack=2.0,
    )


@settings(SETTINGS, max_examples=150)
@given(x=tensors(), empty_dtype=st.sampled_from(ALL_DTYPES))
def test_merge_with_empty_is_identity(x: torch.Tensor, empty_dtype: torch.dtype) -> None:
    row = tensor_partials(x, None)[0]
    empty = tensor_partials(torch.empty(0, dtype=empty_dtype), None)[0]
    for merged in (merge(row, empty), merge(empty, row)):
        # n * mean / n is one product and one quotient: allow the mean its last bit, and M2
        # the n * ulp**2 that this bit adds to the spread term.
        n, mean, m2 = (row[f].item() for f in (Field.COUNT, Field.MEAN, Field.M2))
        assert abs(merged[Field.MEAN].item() - mean) <= math.ulp(mean)
        assert abs(merged[Field.M2].item() - m2) <= 1e-15 * m2 + n * math.ulp(mean) ** 2
        for field in EXACT_FIELDS:
            assert merged[field].item() == row[field].item(), field.name
    a = values_of(x)
    assert_merged_exactly(merge(row, empty), a, counts_only(x))


@settings(SETTINGS, max_examples=150)
@given(
    case=split(FLOAT_DTYPES, max_pieces=10),
    groups=st.integers(1, 4),
    data=st.data(),
)
def test_merge_groups_interleaved(
    case: tuple[torch.Tensor, list[torch.Tensor]], groups: int, data: st.DataObject
) -> None:
    _, pieces = case
    ids = data.draw(
        st.lists(st.integers(0, groups - 1), min_size=len(pieces), max_size=len(pieces))
    )
    group = torch.tensor(ids, dtype=torch.int64)
    values = [values_of(p) for p in pieces]
    exact_rows = torch.from_numpy(np.stack([reference_row(v) for v in values]))
    from_numpy = merge_groups(exact_rows, group, groups)
    from_tensors = finalize(merge_groups(partials(pieces), group, groups))
    assert from_numpy.shape == (groups, WIDTH)
    float64 = pieces[0].dtype == torch.float64
    for g in range(groups):
        a = np.concatenate([v for v, i in zip(values, ids, strict=True) if i == g] + [np.empty(0)])
        assert_merged_float64(from_numpy[g], a)
        check_stats(row_stats(from_tensors, g), reference_stats(a), float64=float64, slack=2.0)


def test_group_without_rows_is_empty() -> None:
    rows = torch.from_numpy(np.stack([reference_row(np.array([1.0, -2.0]))] * 2))
    merged = merge_groups(rows, torch.tensor([0, 2]), 3)
    expected = np.zeros(WIDTH)
    expected[Field.MIN], expected[Field.MAX] = math.inf, -math.inf
    np.testing.assert_array_equal(merged[1].numpy(), expected)
    assert merged[0, Field.COUNT].item() == merged[2, Field.COUNT].item() == 2


@pytest.mark.parametrize("loc", [1e4, 1e8])
def test_200_rows_with_large_means(loc: float) -> None:
    # sum(x**2) - n * mean**2 would lose ~log10(loc**2 * eps64) digits: all of them at 1e8.
    rng = np.random.default_rng(1)
    pieces = [loc + 0.01 * j + rng.standard_normal(50) for j in range(200)]
    rows = torch.from_numpy(np.stack([reference_row(p) for p in pieces]))
    merged = merge_groups(rows, torch.zeros(200, dtype=torch.int64), 1)[0]
    whole = np.concatenate(pieces)
    variance = merged[Field.M2].item() / (merged[Field.COUNT].item() - 1)
    assert merged[Field.COUNT].item() == whole.size
    assert abs(merged[Field.MEAN].item() - whole.mean()) <= 5e-14 * loc  # 200-term sum
    # numpy's own two-pass variance carries ~eps * loc / std of its mean's rounding.
    assert abs(variance - whole.var(ddof=1)) <= (1e-12 + 1e-15 * loc) * whole.var(ddof=1)


def test_200_float32_pieces_mean_1e4_std_1() -> None:
    rng = np.random.default_rng(2)
    x = torch.from_numpy(1e4 + rng.standard_normal(200 * 64)).float()
    merged = merge_groups(partials(list(x.split(64))), torch.zeros(200, dtype=torch.int64), 1)
    a = values_of(x)
    stats = row_stats(finalize(merged), 0)
    assert abs(stats["mean"] - a.mean()) <= 1e-5
    assert abs(stats["std"] - a.std(ddof=1)) <= 1e-5 * a.std(ddof=1)
