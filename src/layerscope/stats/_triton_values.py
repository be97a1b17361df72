"""How the GPU kernels read values: decoding each dtype, histogram slots, the formats' counts.

Element-wise ``triton.jit`` helpers of ``_triton_kernels``, which imports triton too.
"""

from __future__ import annotations

import triton
import triton.language as tl

from layerscope.stats import _triton_modes as modes

FLOAT64 = tl.constexpr(modes.FLOAT64)
E4M3 = tl.constexpr(modes.E4M3)
E5M2 = tl.constexpr(modes.E5M2)
BF16 = tl.constexpr(modes.BF16)
HEADROOM = tl.constexpr(8)  # the formats' counted fields: each one's overflow, then underflow


@triton.jit
def decode(raw, KIND: tl.constexpr):
    """Values of the raw elements: float32 (float64 for float64)."""
    if KIND == E4M3:
        bits = raw.to(tl.int32)
        magnitude = bits & 0x7F
        exponent = magnitude >> 3
        mantissa = magnitude & 7
        # Normal: float32 of the same sign, exponent rebiased from 7 to 127, mantissa shifted.
        normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
        value = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)  # 2**-9
        value = tl.where(magnitude == 0x7F, float("nan"), value)
        return tl.where((bits & 0x80) != 0, -value, value)
    elif KIND == E5M2:
        return (raw.to(tl.int16) << 8).to(tl.float16, bitcast=True).to(tl.float32)
    elif KIND == BF16:
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif KIND == FLOAT64:
        return raw
    else:
        return raw.to(tl.float32)


@triton.jit
def power_of_two(k):
    """2**k as float64 for integer k in [-1022, 1023], built from its bits."""
    return ((k + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)


@triton.jit
def log2_slots(x, KIND: tl.constexpr):
    """The log2 histogram's slot: float32's biased exponent; 0 zero and subnormal, 255 NaN/Inf."""
    if KIND == FLOAT64:
        exponent = ((x.to(tl.int64, bitcast=True) >> 52) & 0x7FF).to(tl.int32)
        slot = tl.minimum(tl.maximum(exponent - (1023 - 127), 0), 254)
        return tl.where(exponent == 0x7FF, 255, slot)
    else:
        return (x.to(tl.int32, bitcast=True) >> 23) & 0xFF


@triton.jit
def signed_log2_slots(x, KIND: tl.constexpr):
    """The signed log2 histogram's slot: ``log2_slots``, plus 256 where the sign bit is set."""
    if KIND == FLOAT64:
        negative = x.to(tl.int64, bitcast=True) < 0
        return log2_slots(x, KIND) + tl.where(negative, 256, 0)
    else:
        return (x.to(tl.int32, bitcast=True) >> 23) & 0x1FF  # the sign, then the exponent


@triton.jit
def linear_slots(x, linear, BINS: tl.constexpr):
    """The linear histogram's slot, as ``linear_bin_index`` computes it, NaN in slot 0."""
    lo = tl.load(linear + 0)
    hi = tl.load(linear + 1)
    scale = tl.load(linear + 2)  # bins / (hi - lo)
    width = tl.load(linear + 3)  # (hi - lo) / bins
    bins = tl.load(linear + 4)  # the number of bins, as float64
    value = x.to(tl.float64)
    nan = value != value
    position = tl.minimum(tl.maximum(tl.floor((value - lo) * scale), -1.0), bins)
    position = tl.where(nan, 0.0, position)
    edge = tl.where(position >= bins, hi, lo + tl.maximum(position, 0.0) * width)
    position -= ((position >= 0) & (value < edge)).to(tl.float64)
    edge = tl.where(position + 1 >= bins, hi, lo + tl.maximum(position + 1, 0.0) * width)
    position += ((position < bins) & (value >= edge)).to(tl.float64)
    return (position + 1).to(tl.int32)


@triton.jit
def magnitude_bits(x, KIND: tl.constexpr):
    """The bits of each value with the sign cleared: they order as ``|x|`` does.

    int64 for float64, int32 for the rest (read as float32, whose bits fit).
    """
    if KIND == FLOAT64:
        return x.to(tl.int64, bitcast=True) & 0x7FFFFFFFFFFFFFFF
    else:
        return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def headroom_counts(x, inside, ranges, KIND: tl.constexpr):
    """Per counted field of the formats: the values whose magnitude bits lie in [low, high).

    ``ranges`` points at the ``(2, HEADROOM)`` bounds of ``_formats.magnitude_ranges``;
    compared as integers, so that no flush-to-zero mode changes a count. One field at a time:
    a (block, fields) comparison at once held about twice the registers.
    """
    magnitude = magnitude_bits(x, KIND)
    fields = tl.arange(0, HEADROOM)
    counts = tl.zeros((HEADROOM,), tl.int32)
    for field in tl.static_range(HEADROOM):
        low = tl.load(ranges + field).to(magnitude.dtype)  # float32's bounds fit int32
        high = tl.load(ranges + HEADROOM + field).to(magnitude.dtype)
        counted = tl.sum((inside & (magnitude >= low) & (magnitude < high)).to(tl.int32), 0)
        counts += tl.where(fields == field, counted, 0)
    return counts
