"""The low-precision formats' counts and scales, at their exact limits, in every CPU kernel.

Each count is checked against ``headroom_reference`` (numpy float64, limits written out from
the formats' definitions), never against another of layerscope's kernels. The Triton kernels'
counts are checked in test_triton.py, the property tests of every field in test_native.py,
test_partials.py and test_merge.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from tests.stats.stats_reference import (
    FORMAT_LIMITS,
    brute_force_scale,
    headroom_reference,
    values_of,
)

from layerscope.stats import (
    FORMATS,
    Field,
    LinearHistogram,
    Log2Histogram,
    _native,
    _torch_kernels,
    finalize,
    format_named,
    scale_exponent,
    tensor_partials,
)

FP8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]


def limit_values() -> np.ndarray:
    """Each format's largest value and smallest subnormal, the float32 on either side of each,
    both signs, with zeros, Inf and NaN (which no format's count takes)."""
    values = [0.0, -0.0, math.inf, -math.inf, math.nan]
    for largest, smallest in FORMAT_LIMITS.values():
        for limit in (np.float32(largest), np.float32(smallest)):
            around = [
                np.nextafter(limit, np.float32(0)),
                limit,
                np.nextafter(limit, np.float32(np.inf)),
            ]
            values += [float(v) for v in around] + [-float(v) for v in around]
    values += [2.0**-149, 1e-40, 3.4e38]  # float32's smallest subnormal, a subnormal, its top
    return np.array(values, dtype=np.float64)


def counts_of(row: torch.Tensor) -> dict[str, int]:
    return {name: int(row[Field[name]].item()) for name in headroom_reference(np.zeros(1))}


def test_the_formats_limits_are_their_definitions():
    for fmt in FORMATS:
        assert (fmt.max, fmt.smallest) == FORMAT_LIMITS[fmt.name.upper()]
    assert [fmt.name for fmt in FORMATS] == ["e4m3", "e5m2", "fp16", "bf16"]


def test_the_reference_counts_beyond_the_limits_only():
    counts = headroom_reference(
        np.array([448.0, -448.0001, 2.0**-9, 2.0**-9 * 0.999, 0.0, math.inf])
    )
    assert (counts["E4M3_OVER"], counts["E4M3_UNDER"]) == (1, 1)
    assert counts["BF16_OVER"] == counts["BF16_UNDER"] == 0


@pytest.mark.skipif(_native.library() is None, reason="no C kernel here")
@pytest.mark.parametrize("isa", _native.ISAS)
@pytest.mark.parametrize("tile", [1, 40, 3000])  # one block, many, and past a thread's share
# With the log2 histogram, three formats' underflow comes from its slots; without, from compares.
@pytest.mark.parametrize("histogram", [Log2Histogram(), None, LinearHistogram(-1.0, 1.0, 4)])
def test_the_c_kernel_counts_at_the_exact_limits(isa, tile, histogram):
    if _native.select_isa(isa) != isa:
        _native.select_isa(None)
        pytest.skip(f"this CPU does not run {isa}")
    try:
        x = torch.from_numpy(np.tile(limit_values(), tile)).float()
        row, _ = tensor_partials(x, histogram)
    finally:
        _native.select_isa(None)
    assert counts_of(row) == headroom_reference(values_of(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_torch_kernels_count_at_the_exact_limits(dtype):
    x = torch.from_numpy(limit_values()).to(dtype)
    kernel = (
        _torch_kernels.float32_partials if dtype == torch.float32 else _torch_kernels.float_partials
    )
    assert counts_of(kernel(x)) == headroom_reference(values_of(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, *FP8])
def test_narrow_dtypes_count_the_values_they_hold(dtype):
    # What a bf16 or fp8 tensor holds after its own rounding: fp16 flushes below 2**-24, so
    # its own underflow count is zero, and fp8 e4m3 holds nothing beyond 448.
    x = torch.from_numpy(np.tile(limit_values(), 50)).to(dtype)
    row, _ = tensor_partials(x, None)
    want = headroom_reference(values_of(x))
    assert counts_of(row) == want
    if dtype == torch.float16:
        assert want["FP16_OVER"] == want["FP16_UNDER"] == 0


def test_float32_subnormals_are_counted_under_flush_to_zero():
    # A flush-to-zero mode reads subnormal inputs as zero in float compares; the kernels
    # compare bits.
    x = torch.tensor([2.0**-140, -(2.0**-149), 2.0**-133, 1.0], dtype=torch.float32)
    before = torch.set_flush_denormal(True)
    try:
        native_row, _ = tensor_partials(x, None)
        torch_row = _torch_kernels.float32_partials(x)
    finally:
        torch.set_flush_denormal(False)
    if not before:
        pytest.skip("no flush-to-zero mode on this CPU")
    want = headroom_reference(np.array([2.0**-140, -(2.0**-149), 2.0**-133, 1.0]))
    assert want["BF16_UNDER"] == 2
    assert counts_of(native_row) == counts_of(torch_row) == want


def test_integer_tensors_count_nothing():
    row, _ = tensor_partials(torch.tensor([10**6, 0, -5]), None)
    assert counts_of(row) == dict.fromkeys(counts_of(row), 0)


def test_the_counts_nest_narrowest_format_first():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(
        rng.standard_normal(20_000) * 10.0 ** rng.integers(-45, 40, 20_000)
    ).float()
    counts = counts_of(tensor_partials(x, None)[0])
    names = [fmt.name.upper() for fmt in FORMATS]
    for narrow, wide in itertools.pairwise(names):
        assert counts[f"{narrow}_OVER"] >= counts[f"{wide}_OVER"]
        assert counts[f"{narrow}_UNDER"] >= counts[f"{wide}_UNDER"]
    assert counts["BF16_UNDER"] > 0
    assert counts["FP16_OVER"] > 0


ABSMAXES = [448.0, 449.0, 447.9, 1.0, 0.75, 1.75, 2.0**-149, 1e-30, 1e30, 3.4e38, 65504.0, 57344.0]


@pytest.mark.parametrize("absmax", ABSMAXES)
def test_finalize_gives_the_largest_power_of_two_that_fits(absmax):
    row, _ = tensor_partials(torch.tensor([absmax, -absmax / 4], dtype=torch.float64), None)
    out = finalize(row[None])
    for fmt in FORMATS:
        want = brute_force_scale(absmax, FORMAT_LIMITS[fmt.name.upper()][0])
        assert out[fmt.scale_exp].item() == want == scale_exponent(absmax, fmt), fmt.name
        assert math.ldexp(absmax, int(want)) <= fmt.max < math.ldexp(absmax, int(want) + 1)


@pytest.mark.parametrize("values", [[0.0, -0.0], [math.nan, math.inf], []])
def test_no_scale_where_absmax_is_zero_or_missing(values):
    out = finalize(tensor_partials(torch.tensor(values), None)[0][None])
    for fmt in FORMATS:
        assert math.isnan(out[fmt.scale_exp].item())
        assert math.isnan(scale_exponent(0.0, fmt))


def test_finalize_reports_the_counts_as_int64():
    x = torch.tensor([1000.0, 1e-3, 1e-6, 0.0, math.nan])
    out = finalize(tensor_partials(x, None)[0][None])
    assert out["e4m3_over"].dtype == torch.int64
    assert [out[f"e4m3_{end}"].item() for end in ("over", "under")] == [1, 2]
    assert [out[f"e5m2_{end}"].item() for end in ("over", "under")] == [0, 1]


def test_a_format_is_named_or_refused_with_the_choices():
    assert format_named("bf16").smallest == 2.0**-133
    with pytest.raises(
        ValueError, match=r"fmt: expected one of 'e4m3', 'e5m2', 'fp16', 'bf16', got 'fp8'"
    ):
        format_named("fp8")
