"""Histograms: log2 bins read from the float32 exponent, linear bins, and their parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_reference import (
    COUNT_DTYPES,
    FLOAT_DTYPES,
    SETTINGS,
    log2_reference,
    tensors,
    values_of,
)

from layerscope.stats import (
    LOG2_BINS,
    LinearHistogram,
    Log2Histogram,
    log2_bin_edges,
    tensor_partials,
)
from layerscope.stats._histogram import parse_histogram


def log2_hist(x: torch.Tensor) -> np.ndarray:
    hist = tensor_partials(x, Log2Histogram())[1]
    assert hist is not None
    assert hist.dtype == torch.int64
    assert hist.shape == (LOG2_BINS,)
    return hist.numpy()


@settings(SETTINGS, max_examples=300)
@given(x=tensors(FLOAT_DTYPES))
def test_log2_histogram_matches_frexp(x: torch.Tensor) -> None:
    hist = log2_hist(x)
    np.testing.assert_array_equal(hist, log2_reference(values_of(x)))
    assert hist.sum() == x.numel()


@settings(SETTINGS, max_examples=30)
@given(x=tensors(COUNT_DTYPES), spec=st.sampled_from([Log2Histogram(), LinearHistogram(0, 1, 3)]))
def test_count_only_dtypes_have_no_histogram(x: torch.Tensor, spec: object) -> None:
    assert tensor_partials(x, spec)[1] is None


def test_log2_bin_edges() -> None:
    edges = log2_bin_edges()
    assert len(edges) == LOG2_BINS
    assert edges[0] == 0.0
    assert edges[-1] == math.inf
    assert edges[1:-1] == [math.ldexp(1.0, k - 127) for k in range(1, 255)]
    assert (edges[126], edges[127], edges[128]) == (0.5, 1.0, 2.0)


def test_log2_every_float32_edge_and_its_predecessor() -> None:
    # For each bin k >= 1: its lower edge 2**(k-127) opens bin k; the float32 just below it
    # closes bin k-1 (for k = 1 that is the largest subnormal, in bin 0). Both signs.
    expected = []
    values = []
    for k in range(1, 255):
        edge = np.float32(math.ldexp(1.0, k - 127))
        below = np.nextafter(edge, np.float32(0))
        for sign in (1, -1):
            values += [sign * edge, sign * below]
            expected += [k, k - 1]
    x = torch.from_numpy(np.array(values, dtype=np.float32))
    want = np.bincount(expected, minlength=LOG2_BINS)
    np.testing.assert_array_equal(log2_hist(x), want)


@pytest.mark.parametrize(
    ("dtype", "value", "k"),
    [
        (torch.float32, 0.0, 0),
        (torch.float32, -0.0, 0),
        (torch.float32, 1e-45, 0),  # smallest subnormal
        (torch.float32, 3.4e38, 254),
        (torch.float32, -math.inf, 255),
        (torch.float32, math.nan, 255),
        (torch.float16, 2.0**-24, 103),  # fp16 subnormal: a normal float32
        (torch.float16, 65504.0, 142),
        (torch.float16, 1e5, 255),  # overflows fp16 to inf
        (torch.bfloat16, 2.0**-130, 0),  # bf16 subnormal, as in float32
        (torch.bfloat16, 1.0, 127),
        (torch.bfloat16, -3.0, 128),
        (torch.float64, 2.0**-127, 0),
        (torch.float64, 2.0**-126, 1),
        (torch.float64, 5e-324, 0),
        (torch.float64, 1.5, 127),
        (torch.float64, 2.0**127, 254),
        (torch.float64, 2.0**128, 254),  # beyond float32, still finite
        (torch.float64, -1e300, 254),
        (torch.float64, math.inf, 255),
        (torch.float64, math.nan, 255),
    ],
)
def test_log2_single_values(dtype: torch.dtype, value: float, k: int) -> None:
    hist = log2_hist(torch.tensor([value], dtype=dtype))
    assert hist[k] == 1
    assert hist.sum() == 1


@pytest.mark.parametrize(("dtype", "n"), [(torch.bfloat16, 10_001), (torch.float16, 100_001)])
def test_log2_counts_are_exact(dtype: torch.dtype, n: int) -> None:
    # Float-accumulated histograms (torch.histc) round such counts, e.g. to 512 for bf16.
    x = torch.zeros(n, dtype=dtype)
    x[::2] = 1.0  # and a second bin with an odd count
    hist = log2_hist(x)
    assert hist[0] == n // 2
    assert hist[127] == n - n // 2
    assert hist.sum() == n


@pytest.mark.parametrize(("dtype", "n"), [(torch.bfloat16, 10_001), (torch.float16, 100_001)])
def test_log2_all_zeros(dtype: torch.dtype, n: int) -> None:
    hist = log2_hist(torch.zeros(n, dtype=dtype))
    assert hist[0] == n
    assert hist.sum() == n


# Linear histogram --------------------------------------------------------------------------


def linear_reference(a: np.ndarray, lo: float, width: float, bins: int) -> np.ndarray:
    """Slot counts by comparison with the exact edges lo + j * width, NaN dropped.

    ``searchsorted(side='right')`` counts the edges <= x: 0 below lo, j+1 in bin j,
    bins+1 at or above hi, which is exactly the slot index.
    """
    edges = lo + width * np.arange(bins + 1)
    slots = np.searchsorted(edges, a[~np.isnan(a)], side="right")
    return np.bincount(slots, minlength=bins + 2)


@st.composite
def dyadic_linear(draw: st.DrawFn) -> tuple[torch.Tensor, float, float, int]:
    """A tensor and bins on a dyadic grid, where float32 arithmetic on x - lo is exact.

    lo is a multiple of 2**-3 within [-8, 8], the width a power of two, and the finite values
    multiples of 2**-8 within [-16, 16] or hi itself (fp16 and bf16 round them onto coarser
    multiples), so (x - lo) / width has no rounding and every bin decision can be checked
    exactly. Rounding near edges is the subject of test_linear_edges_are_exact.
    """
    lo = draw(st.integers(-64, 64)) / 8
    width = 2.0 ** draw(st.integers(-4, 2))
    bins = draw(st.integers(1, 20))
    hi = lo + width * bins
    grid = st.integers(-(2**12), 2**12).map(lambda i: i / 256)
    special = st.sampled_from([math.nan, math.inf, -math.inf, 1e30, -1e30, lo, hi])
    values = draw(st.lists(st.one_of(grid, special), max_size=30))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values += list(rng.integers(-(2**12), 2**12, draw(st.integers(0, 400))) / 256)
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    return torch.tensor(values, dtype=dtype), lo, width, bins


@settings(SETTINGS, max_examples=300)
@given(case=dyadic_linear())
def test_linear_histogram_matches_numpy(case: tuple[torch.Tensor, float, float, int]) -> None:
    x, lo, width, bins = case
    spec = LinearHistogram(lo, lo + width * bins, bins)
    hist = tensor_partials(x, spec)[1]
    assert hist.dtype == torch.int64
    assert hist.shape == (bins + 2,)
    a = values_of(x)
    np.testing.assert_array_equal(hist.numpy(), linear_reference(a, lo, width, bins))
    assert hist.sum() == a.size - np.isnan(a).sum()


def test_linear_underflow_overflow_and_nan() -> None:
    x = torch.tensor([-math.inf, -1.0, 0.0, 0.5, 0.99, 1.0, 2.0, math.inf, math.nan, math.nan])
    hist = tensor_partials(x, LinearHistogram(0.0, 1.0, 2))[1]
    # slots: [< 0 | [0, .5) | [.5, 1) | >= 1]; NaN is counted nowhere.
    assert hist.tolist() == [2, 1, 2, 3]


@pytest.mark.parametrize(
    ("dtype", "value", "lo", "hi", "bins", "slot"),
    [
        # A negative value next to the edge at zero belongs to [-1, 0), not to [0, 1).
        (torch.float32, -1e-8, -4.0, 4.0, 8, 4),
        (torch.float32, -1e-30, -4.0, 4.0, 8, 4),
        (torch.float64, -1e-300, -4.0, 4.0, 8, 4),
        # float32(0.9) = 0.89999997... lies in [0.8, 0.9).
        (torch.float32, 0.9, 0.0, 1.0, 10, 9),
    ],
)
def test_linear_edges_are_exact(
    dtype: torch.dtype, value: float, lo: float, hi: float, bins: int, slot: int
) -> None:
    x = torch.tensor([value], dtype=dtype)
    a = values_of(x)
    edges = np.linspace(lo, hi, bins + 1)
    assert np.searchsorted(edges, a, side="right")[0] == slot  # the reference agrees
    hist = tensor_partials(x, LinearHistogram(lo, hi, bins))[1]
    assert hist[slot] == 1, hist.tolist()


@pytest.mark.parametrize(
    ("values", "lo", "hi", "bins", "expected"),
    [
        # The whole float32 range in one bin: the width overflows float32, inf / inf is NaN.
        ([0.0, math.inf], -3e38, 3e38, 1, [0, 1, 1]),
        # lo and hi beyond float32's range.
        ([1.0], -(2.0**130), 2.0**130, 4, [0, 0, 0, 1, 0, 0]),
        # A width below float32's smallest subnormal: 0 / 0 is NaN.
        ([0.0, 1.0], 0.0, 1e-46, 4, [0, 1, 0, 0, 0, 1]),
    ],
)
def test_linear_ranges_float32_cannot_hold(
    values: list[float], lo: float, hi: float, bins: int, expected: list[int]
) -> None:
    # parse_histogram accepts these specs; a float32 tensor must still be counted.
    spec = parse_histogram(("linear", lo, hi, bins))
    a = np.array(values)
    np.testing.assert_array_equal(
        np.searchsorted(np.linspace(lo, hi, bins + 1), a, "right"),
        np.repeat(np.arange(bins + 2), expected),
    )
    hist = tensor_partials(torch.tensor(values, dtype=torch.float32), spec)[1]
    assert hist.tolist() == expected


# parse_histogram ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        (None, None),
        (("linear", -1, 1, 10), LinearHistogram(-1.0, 1.0, 10)),
        (("linear", -0.5, 2.5, 3.0), LinearHistogram(-0.5, 2.5, 3)),
        (("linear", 0, 1e-3, 1), LinearHistogram(0.0, 1e-3, 1)),
    ],
)
def test_parse_histogram_accepts(arg: object, expected: object) -> None:
    spec = parse_histogram(arg)
    assert spec == expected
    if isinstance(spec, LinearHistogram):
        assert isinstance(spec.bins, int)
        assert spec.slots == spec.bins + 2


def test_parse_histogram_log2() -> None:
    spec = parse_histogram("log2")
    assert isinstance(spec, Log2Histogram)
    assert spec.slots == LOG2_BINS == 256


@pytest.mark.parametrize(
    "arg",
    [
        "LOG2",
        "linear",
        "log",
        True,
        0,
        256,
        ("linear", 0, 1),
        ("linear", 0, 1, 10, 5),
        ["linear", 0, 1, 10],
        ("lin", 0, 1, 10),
        ("linear", "0", 1, 10),
        ("linear", 0, 1, 2.5),
        ("linear", 0, 1, True),
        ("linear", False, 1, 4),
        ("linear", 0, 1, 0),
        ("linear", 0, 1, -3),
        ("linear", 1, 0, 4),
        ("linear", 1, 1, 4),
        ("linear", 0, math.inf, 4),
        ("linear", math.nan, 1, 4),
        ("linear", 0, 1, math.inf),
        ("linear", 0, 1, math.nan),
        ("linear", 0, 1, None),
        {"linear": (0, 1, 10)},
    ],
)
def test_parse_histogram_rejects(arg: object) -> None:
    with pytest.raises(ValueError, match="histogram"):
        parse_histogram(arg)


@pytest.mark.parametrize(("lo", "hi", "bins"), [(1.0, 0.0, 3), (0.0, math.nan, 3), (0.0, 1.0, 0)])
def test_linear_histogram_validates(lo: float, hi: float, bins: int) -> None:
    with pytest.raises(ValueError, match="histogram"):
        LinearHistogram(lo, hi, bins)
