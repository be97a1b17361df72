"""The GPU kernels (stats/_triton.py), run on CPU tensors in triton's interpreter.

Every row is checked against numpy float64 (stats_reference.py), never against another of
layerscope's kernels: counts, extremes and histograms exactly, mean and M2 to 1e-12 of the
data's own scale (float64 accumulation, as the issue of the GPU path asks).
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np
import pytest
import torch
from tests.stats.stats_reference import (
    EXACT_FIELDS,
    FORMAT_LIMITS,
    headroom_reference,
    log2_reference,
    reference_row,
    signed_log2_reference,
)

from layerscope.stats import Field, LinearHistogram, Log2Histogram, SignedLog2Histogram
from layerscope.stats._layout import WIDTH

triton = pytest.importorskip("triton")
# float64 values near 1e300 overflow M2 on purpose; numpy (the interpreter's and the
# reference's) says so.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
# Compiled on a GPU; on CPU tensors in the interpreter elsewhere.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs a GPU or triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

from layerscope.stats import _triton  # noqa: E402  (after the interpreter is switched on)


def _forced() -> contextlib.AbstractContextManager[None]:
    return _triton.on_cpu() if DEVICE == "cpu" else contextlib.nullcontext()


FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
# 0, 1, odd, one block (64 in the interpreter), one past it, and more blocks than the four
# programs of a tensor take in one round, so that each program loops.
SIZES = (0, 1, 7, 64, 65, 1001)
LINEAR = LinearHistogram(-2.0, 3.0, 5)


def _values(numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Normal values at several scales with NaN, +-Inf, +-0, subnormals and bin edges."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(numel, generator=generator) < 0.3
    if not dtype.is_floating_point:
        low = 0 if dtype == torch.uint8 else -100
        return torch.randint(low, 100, (numel,), generator=generator, dtype=torch.int64).to(dtype)
    x = torch.randn(numel, generator=generator, dtype=torch.float64)
    x *= 10.0 ** torch.randint(-3, 4, (numel,), generator=generator)
    specials = [
        math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -1e-42, 2.0**-126, 2.0**-127,
        1.0, 2.0, 0.5, -4.0, 3.0, -2.0, 0.9999999, 2.9999999, 1e300, 1e-310,
    ]  # fmt: skip
    for position, value in zip(range(0, numel, 3), specials, strict=False):
        x[position] = value
    return x.to(dtype)


def _row_of(x: torch.Tensor, histogram) -> torch.Tensor:
    slots = 0 if histogram is None else histogram.slots
    rows = torch.full((3, WIDTH + slots), -7.0, dtype=torch.float64, device=DEVICE)
    with _forced():  # stale values around the row
        assert _triton.reads(x.to(DEVICE))
        _triton.partials_into(x.to(DEVICE), histogram, rows, 1)
    rows = rows.cpu()
    assert (rows[[0, 2]] == -7.0).all()  # its own row only
    return rows[1]


def _reference(x: torch.Tensor) -> tuple[np.ndarray, bool]:
    only_counts = not x.is_floating_point()
    a = x.reshape(-1).double().numpy() if not only_counts else x.reshape(-1).long().numpy()
    return reference_row(a, only_counts), only_counts


def _check_row(got: torch.Tensor, x: torch.Tensor) -> None:
    want, only_counts = _reference(x)
    got_row = got[:WIDTH].numpy()
    for field in EXACT_FIELDS:
        assert got_row[field] == want[field], (field.name, got_row[field], want[field])
    finite = x.reshape(-1).double()
    finite = finite[torch.isfinite(finite)] if not only_counts else finite[:0]
    scale = float(finite.abs().mean()) if finite.numel() else 0.0
    assert abs(got_row[Field.MEAN] - want[Field.MEAN]) <= 1e-12 * scale
    squares = float((finite * finite).sum()) if finite.numel() else 0.0
    if math.isinf(want[Field.M2]):  # float64 values near 1e300: M2 overflows, as it should
        assert got_row[Field.M2] == math.inf
    else:
        assert abs(got_row[Field.M2] - want[Field.M2]) <= 1e-12 * squares


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_float_rows_and_log2_histogram_match_float64(dtype: torch.dtype, numel: int) -> None:
    x = _values(numel, dtype)
    got = _row_of(x, Log2Histogram())
    _check_row(got, x)
    a = x.double().numpy()
    if dtype == torch.float64:  # the histogram bins float64 values on float32's exponents
        counts = log2_reference(a)
    else:
        counts = log2_reference(x.float().double().numpy())
    assert got[WIDTH:].tolist() == counts.tolist()


@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_the_log2_histogram_split_by_sign_matches_float64(dtype: torch.dtype) -> None:
    x = _values(301, torch.float64, seed=2)  # more blocks than the programs: each one loops
    x[1::5] = -x[1::5]  # -0.0, -inf, -NaN and negative subnormals among them
    x = x.to(dtype)
    got = _row_of(x, SignedLog2Histogram())
    _check_row(got, x)
    a = x.double().numpy() if dtype == torch.float64 else x.float().double().numpy()
    assert got[WIDTH:].tolist() == signed_log2_reference(a).tolist()
    tensors = [x[:100], x[100:107], x[107:]]  # a group: its programs' histograms per tensor
    rows = torch.zeros(3, WIDTH + 2 * 256, dtype=torch.float64, device=DEVICE)
    with _forced():
        _triton.group_partials_into([t.to(DEVICE) for t in tensors], SignedLog2Histogram(), rows, 0)
    for row, part in zip(rows.cpu(), tensors, strict=True):
        b = part.double().numpy() if dtype == torch.float64 else part.float().double().numpy()
        assert row[WIDTH:].tolist() == signed_log2_reference(b).tolist()


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_linear_histogram_matches_the_edges(dtype: torch.dtype, numel: int) -> None:
    x = _values(numel, dtype, seed=1)
    if numel > 10:  # values on and beside every edge
        edges = [LINEAR.lo + k * (LINEAR.hi - LINEAR.lo) / LINEAR.bins for k in range(6)]
        x[-12:] = torch.tensor(edges + [math.nextafter(e, -math.inf) for e in edges]).to(dtype)
    got = _row_of(x, LINEAR)
    _check_row(got, x)
    a = x.double().numpy()
    a = a[~np.isnan(a)]
    edges = np.array([LINEAR.lo + k * 1.0 for k in range(LINEAR.bins)] + [LINEAR.hi])
    want = np.bincount(np.searchsorted(edges, a, side="right"), minlength=LINEAR.slots)
    assert got[WIDTH:].tolist() == want.tolist()


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_and_boolean_rows_count_only(dtype: torch.dtype, numel: int) -> None:
    x = _values(numel, dtype)
    got = _row_of(x, Log2Histogram())
    _check_row(got, x)
    assert (got[WIDTH:] == 0).all()  # no histogram: its slots are zeros, not stale values


@pytest.mark.parametrize("histogram", [None, Log2Histogram(), LINEAR])
def test_no_histogram_and_views(histogram) -> None:
    x = _values(1001, torch.float32).reshape(7, 11, 13)
    for view in (x.transpose(0, 2), x[:, ::2], x.permute(1, 2, 0).contiguous()):
        got = _row_of(view, histogram)
        _check_row(got, view)


def test_channels_last_is_read_in_place() -> None:
    x = _values(2 * 3 * 5 * 7, torch.bfloat16).reshape(2, 3, 5, 7)
    x = x.contiguous(memory_format=torch.channels_last)
    _check_row(_row_of(x, Log2Histogram()), x)


def test_a_group_writes_each_tensor_its_row() -> None:
    tensors = [_values(n, torch.bfloat16, seed=n) for n in (1001, 0, 1, 65, 7, 300)]
    histogram = Log2Histogram()
    shape = (len(tensors) + 2, WIDTH + histogram.slots)
    rows = torch.full(shape, -7.0, dtype=torch.float64, device=DEVICE)
    on_device = [x.to(DEVICE) for x in tensors]
    with _forced():
        _triton.group_partials_into(on_device, histogram, rows, 1)
        _triton.group_partials_into(on_device, histogram, rows, 1)  # its table kept: same rows
    rows = rows.cpu()
    assert (rows[[0, -1]] == -7.0).all()
    for i, x in enumerate(tensors):
        _check_row(rows[1 + i], x)
        counts = log2_reference(x.float().double().numpy())
        assert rows[1 + i, WIDTH:].tolist() == counts.tolist()


def test_input_is_left_as_it_was() -> None:
    x = _values(1001, torch.float16).to(DEVICE)
    before = x.clone()
    _row_of(x, LINEAR)
    assert torch.equal(x.view(torch.int16), before.view(torch.int16))


@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_group_extremes_are_aminmax_with_nan_winning(dtype: torch.dtype) -> None:
    tensors = [_values(n, dtype, seed=n) for n in (1001, 1, 65, 7, 300)]
    tensors[1] = torch.tensor([-math.inf]).to(dtype)  # an infinity is its own extreme
    no_nan = tensors[3].double()
    tensors[3] = no_nan.masked_fill(no_nan.isnan(), 0.0).to(dtype)  # a tensor without NaN
    pairs = torch.full((len(tensors), 2), -7.0, dtype=torch.float64, device=DEVICE)
    with _forced():
        _triton.group_extremes_into([x.to(DEVICE) for x in tensors], pairs)
    for got, x in zip(pairs.cpu().tolist(), tensors, strict=True):
        values = x.double()
        if values.isnan().any():
            assert all(math.isnan(v) for v in got)
        else:
            assert got == [values.min().item(), values.max().item()]


@pytest.mark.parametrize("dtype", FLOATS + FP8)
def test_the_formats_counts_at_their_exact_limits(dtype: torch.dtype) -> None:
    # Each format's largest value and smallest subnormal, and the float32 on either side.
    values = [0.0, math.inf, math.nan, 2.0**-149, 1e39]
    for largest, smallest in FORMAT_LIMITS.values():
        for limit in (np.float32(largest), np.float32(smallest)):
            for side in (0.0, np.inf):
                values += [float(np.nextafter(limit, np.float32(side))), -float(limit)]
    x = torch.tensor(values * 40, dtype=torch.float64).to(dtype)  # several blocks and programs
    got = _row_of(x, None)
    want = reference_row(x.double().numpy())
    for name in headroom_reference(np.zeros(1)):
        assert got[Field[name]].item() == want[Field[name]], name
