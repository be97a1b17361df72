"""tensor_partials against numpy float64, one tensor at a time."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_reference import (
    ALL_DTYPES,
    EXACT_FIELDS,
    SETTINGS,
    check_stats,
    counts_only,
    reference_row,
    reference_stats,
    row_stats,
    tensors,
    values_of,
)

from layerscope.stats import Field, LinearHistogram, Log2Histogram, finalize, tensor_partials
from layerscope.stats._layout import WIDTH

_SPECS = (None, Log2Histogram(), LinearHistogram(-1.0, 1.0, 4))


@settings(SETTINGS, max_examples=400)
@given(x=tensors(ALL_DTYPES), spec=st.sampled_from(_SPECS))
def test_partials_and_stats_match_numpy(x: torch.Tensor, spec: object) -> None:
    row, hist = tensor_partials(x, spec)
    a = values_of(x)
    only_counts = counts_only(x)
    assert row.dtype == torch.float64
    assert row.shape == (WIDTH,)
    want = reference_row(a, only_counts)
    got = row.numpy()
    for field in EXACT_FIELDS:
        assert got[field] == want[field], field.name
    if only_counts:
        assert hist is None
        np.testing.assert_array_equal(got, want)  # no moments: mean and M2 stay 0
    elif spec is None:
        assert hist is None
    else:
        assert hist.dtype == torch.int64
        assert hist.shape == (spec.slots,)
    stats = row_stats(finalize(row[None]), 0)
    check_stats(stats, reference_stats(a, only_counts), float64=x.dtype == torch.float64)


@settings(SETTINGS, max_examples=50)
@given(x=tensors())
def test_input_is_not_modified(x: torch.Tensor) -> None:
    before = x.clone()
    strides = x.stride()
    tensor_partials(x, Log2Histogram())
    assert x.stride() == strides
    np.testing.assert_array_equal(values_of(x), values_of(before))


def test_doc_example_values() -> None:
    row, hist = tensor_partials(torch.tensor([1.0, -2.0, float("nan")]), Log2Histogram())
    assert row[Field.COUNT].item() == 2
    assert row[Field.MEAN].item() == -0.5
    assert row[Field.M2].item() == 4.5  # (1.5**2) * 2
    assert row[Field.NAN].item() == 1
    assert hist.sum().item() == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("spec", _SPECS)
def test_empty_tensor(dtype: torch.dtype, spec: object) -> None:
    row, hist = tensor_partials(torch.empty(0, 3, dtype=dtype), spec)
    expected = np.zeros(WIDTH)
    expected[Field.MIN], expected[Field.MAX] = math.inf, -math.inf
    np.testing.assert_array_equal(row.numpy(), expected)
    if dtype.is_floating_point and spec is not None:
        assert hist.dtype == torch.int64
        assert torch.equal(hist, torch.zeros(spec.slots, dtype=torch.int64))
    else:
        assert hist is None


def test_signed_zero_and_nonfinite_counts() -> None:
    x = torch.tensor([-0.0, 0.0, -math.inf, math.inf, math.nan, -1.0, 2.0])
    row = tensor_partials(x, None)[0].numpy()
    # -0.0 is a zero and not negative; -inf is negative, +inf positive, NaN neither.
    assert (row[Field.ZEROS], row[Field.NEG], row[Field.POS]) == (2, 2, 2)
    assert (row[Field.NAN], row[Field.INF], row[Field.COUNT]) == (1, 2, 4)
    assert (row[Field.MIN], row[Field.MAX]) == (-1.0, 2.0)


def test_all_nonfinite_has_no_moments() -> None:
    x = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.bfloat16)
    row = tensor_partials(x, None)[0].numpy()
    assert row[Field.COUNT] == 0
    assert (row[Field.MIN], row[Field.MAX]) == (math.inf, -math.inf)
    assert (row[Field.MEAN], row[Field.M2]) == (0.0, 0.0)
    stats = row_stats(finalize(torch.from_numpy(row)[None]), 0)
    for key in ("mean", "std", "min", "max", "l2"):
        assert math.isnan(stats[key]), key


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.complex64])
def test_other_count_only_dtypes(dtype: torch.dtype) -> None:
    source = np.array([0, 3, 0, 7, 1, 0, 2])
    if dtype.is_signed and not dtype.is_complex:
        source = np.array([0, -3, 0, 7, -1, 0, 2])
    x = torch.from_numpy(source).to(dtype)
    if dtype.is_complex:
        x = x * 1j  # purely imaginary: still nonzero, with no sign
    row, hist = tensor_partials(x, Log2Histogram())
    assert hist is None
    a = x.numpy()
    zeros = np.count_nonzero(a == 0)
    neg = 0 if dtype.is_complex else np.count_nonzero(a < 0)
    assert row[Field.NUMEL].item() == a.size
    assert row[Field.ZEROS].item() == zeros
    assert row[Field.NEG].item() == neg
    assert row[Field.POS].item() == a.size - zeros - neg
    assert row[Field.COUNT].item() == 0


def test_mean_1e4_std_1_beats_float32_resolution() -> None:
    # float32's ulp at 1e4 is ~1e-3; the corrected mean lands far closer than that.
    rng = np.random.default_rng(0)
    x = torch.from_numpy(1e4 + rng.standard_normal(1_000_000)).float()
    a = values_of(x)
    stats = row_stats(finalize(tensor_partials(x, None)[0][None]), 0)
    assert abs(stats["mean"] - a.mean()) <= 1e-5
    assert abs(stats["std"] - a.std(ddof=1)) <= 1e-5 * a.std(ddof=1)


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        (torch.float32, [1e-39, -1e-39]),
        (torch.float32, [0.0, 1e-40, 3e-40]),
        (torch.bfloat16, [1e-39, 2e-39, -5e-40]),
    ],
)
def test_float32_subnormal_only_tensor(dtype: torch.dtype, values: list[float]) -> None:
    # Finite, tiny values: every square is representable in the float64 row.
    x = torch.tensor(values, dtype=dtype)
    a = values_of(x)
    stats = row_stats(finalize(tensor_partials(x, None)[0][None]), 0)
    ref = reference_stats(a)
    assert abs(stats["mean"] - ref["mean"]) <= 1e-5 * ref["absmax"], stats
    assert abs(stats["std"] - ref["std"]) <= 1e-4 * ref["std"], stats
    assert abs(stats["l2"] - ref["l2"]) <= 1e-4 * ref["l2"], stats


@pytest.mark.parametrize("values", [[1e308], [1e308, 1.5e308], [1e-310, 3e-310], [5e-324]])
def test_float64_extreme_mean(values: list[float]) -> None:
    # The mean of finite float64 values is itself a finite float64 (numpy's reference is taken
    # on values scaled by an exact power of two, so that its sum cannot overflow).
    x = torch.tensor(values, dtype=torch.float64)
    mean = tensor_partials(x, None)[0][Field.MEAN].item()
    scale = 2.0**-8 if max(values) > 1 else 2.0**64
    assert math.isfinite(mean)
    assert abs(mean - np.mean(np.array(values) * scale) / scale) <= 1e-12 * max(values)


class HostSyncError(AssertionError):
    pass


_SYNCING = ("item", "tolist", "__bool__", "cpu", "numpy", "__float__", "__int__", "__index__")


def _refuse(name: str) -> Callable[..., None]:
    def method(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise HostSyncError(f"Tensor.{name} called: a host sync")

    return method


def test_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    inputs = [
        torch.randn(64, 3),
        torch.randn(5, 7).to(torch.bfloat16),
        torch.randn(9).half(),
        torch.randn(4, 4, dtype=torch.float64),
        torch.tensor([1.0, math.nan, -math.inf, 0.0, math.inf]),
        torch.full((3,), math.nan),
        torch.tensor(2.5),
        torch.empty(0),
        torch.empty(0, 2, dtype=torch.int64),
        torch.arange(-5, 6, dtype=torch.int32),
        torch.tensor([True, False, True]),
    ]
    specs = (None, Log2Histogram(), LinearHistogram(-2.0, 2.0, 8))
    for name in _SYNCING:
        monkeypatch.setattr(torch.Tensor, name, _refuse(name))
    with pytest.raises(HostSyncError):
        bool(torch.ones(()))  # the trap is armed
    results = [(x, spec, *tensor_partials(x, spec)) for x in inputs for spec in specs]
    monkeypatch.undo()
    for x, spec, row, hist in results:
        assert row[Field.NUMEL].item() == x.numel()
        if x.is_floating_point() and spec is not None:
            dropped = int(torch.isnan(x).sum()) if isinstance(spec, LinearHistogram) else 0
            assert hist.sum().item() == x.numel() - dropped
        else:
            assert hist is None
