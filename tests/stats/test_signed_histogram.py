"""The log2 histogram split by sign: every kernel against numpy, the magnitudes unchanged.

The reference (``signed_log2_reference``) bins each sign's values by ``np.frexp`` in float64,
the sign read with ``np.signbit``; the kernels read the top nine bits of float32 (float64's
sign and exponent on the GPU and in torch's kernel).
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from stats_reference import (
    EXACT_FIELDS,
    FLOAT_DTYPES,
    SETTINGS,
    signed_log2_reference,
    tensors,
    values_of,
)

from layerscope.stats import (
    LOG2_BINS,
    Log2Histogram,
    SignedLog2Histogram,
    _native,
    _torch_kernels,
    tensor_partials,
)
from layerscope.stats._layout import WIDTH

SIGNED = SignedLog2Histogram()
SPECIALS = (-0.0, 0.0, math.inf, -math.inf, math.nan, -math.nan, 1e-40, -1e-42, -1e38)
FP8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]


def _exact(row: torch.Tensor) -> list[float]:
    return [float(row[field]) for field in EXACT_FIELDS]


@settings(SETTINGS, max_examples=100)
@given(x=tensors(FLOAT_DTYPES))
def test_the_split_matches_numpy_and_its_halves_add_up_to_the_magnitudes(x: torch.Tensor) -> None:
    row, hist = tensor_partials(x, SIGNED)
    plain_row, magnitudes = tensor_partials(x, Log2Histogram())
    assert hist is not None
    assert magnitudes is not None
    assert hist.dtype == torch.int64
    assert hist.shape == (2 * LOG2_BINS,)
    np.testing.assert_array_equal(hist.numpy(), signed_log2_reference(values_of(x)))
    assert torch.equal(hist[:LOG2_BINS] + hist[LOG2_BINS:], magnitudes)
    assert _exact(row) == _exact(plain_row)  # the partials do not depend on the split


@pytest.mark.parametrize(
    ("dtype", "value", "slot"),
    [
        (torch.float32, 0.0, 0),
        (torch.float32, -0.0, 256),
        (torch.float32, -1e-45, 256),  # the smallest subnormal
        (torch.float32, -1.0, 256 + 127),
        (torch.float32, -3.4e38, 256 + 254),
        (torch.float32, math.inf, 255),
        (torch.float32, -math.inf, 511),
        (torch.float32, math.nan, 255),
        (torch.float32, -math.nan, 511),  # a NaN goes by its sign bit
        (torch.float16, -(2.0**-24), 256 + 103),  # an fp16 subnormal: a normal float32
        (torch.float16, -1e5, 511),  # overflows fp16 to -inf
        (torch.bfloat16, -(2.0**-130), 256),  # a bf16 subnormal, as in float32
        (torch.bfloat16, -3.0, 256 + 128),
        (torch.float64, -0.0, 256),
        (torch.float64, -5e-324, 256),
        (torch.float64, -(2.0**-126), 257),
        (torch.float64, -(2.0**128), 256 + 254),  # beyond float32, still finite
        (torch.float64, 2.0**128, 254),
        (torch.float64, -math.inf, 511),
        (torch.float64, -math.nan, 511),
    ],
)
def test_single_values_land_in_their_slot(dtype: torch.dtype, value: float, slot: int) -> None:
    hist = tensor_partials(torch.tensor([value], dtype=dtype), SIGNED)[1]
    assert hist is not None
    assert hist[slot] == 1
    assert hist.sum() == 1


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_keeps_its_sign(dtype: torch.dtype) -> None:
    # -0.0, -1.0, the byte of a NaN with the sign bit and 1.5: as torch decodes them.
    x = torch.tensor(
        [0x80, 0xB8 if dtype == torch.float8_e4m3fn else 0xBC, 0xFF, 0x3C], dtype=torch.uint8
    )
    x = x.view(dtype)
    hist = tensor_partials(x, SIGNED)[1]
    assert hist is not None
    np.testing.assert_array_equal(hist.numpy(), signed_log2_reference(x.float().double().numpy()))


def _mixed(numel: int, seed: int) -> torch.Tensor:
    """Blocks the C kernel counts each way: narrow spans (its vector path), no sign bit at all
    (a ReLU's), and spans too wide for the vector path; specials of both signs throughout."""
    generator = torch.Generator().manual_seed(seed)
    third = numel // 3
    narrow = torch.randn(third, generator=generator)
    relu = torch.randn(third, generator=generator).relu()
    wide = torch.randn(numel - 2 * third, generator=generator)
    wide *= 10.0 ** torch.randint(-30, 30, wide.shape, generator=generator)
    x = torch.cat([narrow, relu, wide])
    for offset, value in enumerate(SPECIALS):
        x[offset * 997 :: 65_537] = value
    return x


def _native_counts(x: torch.Tensor) -> np.ndarray:
    rows = torch.zeros(1, WIDTH + SIGNED.slots, dtype=torch.float64)
    _native.partials_into(x, rows, 0, SIGNED)
    return rows[0, WIDTH:].long().numpy()


def _triton_counts(x: torch.Tensor) -> np.ndarray | None:
    """The GPU kernels' counts (in triton's interpreter without a GPU); None without either."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        return None
    pytest.importorskip("triton")
    from layerscope.stats import _triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = torch.zeros(1, WIDTH + SIGNED.slots, dtype=torch.float64, device=device)
    with _triton.on_cpu() if device == "cpu" else contextlib.nullcontext():
        _triton.partials_into(x.to(device), SIGNED, rows, 0)
    return rows[0, WIDTH:].long().cpu().numpy()


@pytest.mark.skipif(_native.library() is None, reason=f"no C kernel: {_native.problem()}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8])
def test_the_three_kernels_count_alike(dtype: torch.dtype) -> None:
    # Several chunks of the C kernel (64 Ki values) and its threads; blocks of every kind.
    x = _mixed(3 * 65_536 + 123, seed=len(str(dtype))).to(dtype)
    want = signed_log2_reference(x.float().double().numpy())
    _, bins = _torch_kernels.float32_partials_and_signed_bins(x.float())
    torch_counts = _torch_kernels.count_bins(bins, SIGNED.slots).numpy()
    np.testing.assert_array_equal(torch_counts, want)
    threads = torch.get_num_threads()
    best = _native.select_isa(None)
    try:
        for isa in _native.ISAS[: _native.ISAS.index(best) + 1]:
            _native.select_isa(isa)
            for count in (1, 2):
                torch.set_num_threads(count)
                np.testing.assert_array_equal(_native_counts(x), want, err_msg=f"{isa}, {count}")
    finally:
        _native.select_isa(None)
        torch.set_num_threads(threads)
    # The interpreter is slow: a few of its blocks, its programs looping, and the specials.
    small = torch.cat([x[:256], x[[offset * 997 for offset in range(len(SPECIALS))]]])
    triton_counts = _triton_counts(small)
    if triton_counts is not None:
        np.testing.assert_array_equal(triton_counts, _native_counts(small))
