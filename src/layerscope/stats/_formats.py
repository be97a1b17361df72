"""The low-precision formats whose headroom each floating tensor's row counts.

For every format, a row counts the values that would overflow (finite, ``|x| > max``) and the
values that would flush to zero (``0 < |x| < smallest``, the smallest positive subnormal), at
those exact limits: a value beyond them cannot be held whatever the rounding (to nearest,
stochastic, saturating, truncating). Non-finite values are counted apart (``nan_count``,
``inf_count``), never here. The formats' ranges nest, narrowest first: what overflows fp16
overflows e5m2 and e4m3, what flushes in fp16 flushes in e5m2 and e4m3.

Magnitudes are compared as bits: a float's magnitude bits order as its magnitude does, every
limit is a float32 (so exact for float32, bf16, fp16 and fp8 values read as float32) and a
float64, and an integer compare is not changed by a flush-to-zero mode.

This module needs no torch: a reader of a stored run takes its names from here.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Format:
    """One low-precision format: its name, largest finite value and smallest subnormal."""

    name: str  # as columns and ``layerscope.precision`` spell it
    label: str  # as a person reads it
    max: float
    smallest: float  # the smallest positive subnormal

    @property
    def over(self) -> str:
        """The column of the count of finite values with ``|x| > max``."""
        return f"{self.name}_over"

    @property
    def under(self) -> str:
        """The column of the count of values with ``0 < |x| < smallest``."""
        return f"{self.name}_under"

    @property
    def scale_exp(self) -> str:
        """The column of the largest k with ``absmax * 2**k <= max``."""
        return f"{self.name}_scale_exp"


#: Narrowest range first: each one's overflow and underflow hold the next one's.
FORMATS = (
    Format("e4m3", "fp8 e4m3", 448.0, 2.0**-9),
    Format("e5m2", "fp8 e5m2", 57344.0, 2.0**-16),
    Format("fp16", "fp16", 65504.0, 2.0**-24),
    Format("bf16", "bf16", 3.3895313892515355e38, 2.0**-133),
)
FORMAT_NAMES = tuple(fmt.name for fmt in FORMATS)

#: The stored statistics of the formats, in column order.
PRECISION_STATS = tuple(
    column for fmt in FORMATS for column in (fmt.over, fmt.under, fmt.scale_exp)
)
#: Those that are counts (int64 columns).
PRECISION_COUNTS = tuple(column for fmt in FORMATS for column in (fmt.over, fmt.under))


def format_named(name: object) -> Format:
    """The format called ``name``; a ValueError naming the choices for anything else.

    Examples:
        >>> format_named("e4m3").max
        448.0
    """
    for fmt in FORMATS:
        if name == fmt.name:
            return fmt
    raise ValueError(f"fmt: expected one of {', '.join(map(repr, FORMAT_NAMES))}, got {name!r}")


def float32_bits(value: float) -> int:
    """The bits of ``value`` as a float32 (it must be one exactly)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    assert struct.unpack("<f", struct.pack("<I", bits))[0] == value, value
    return int(bits)


def float64_bits(value: float) -> int:
    """The bits of ``value`` as a float64."""
    (bits,) = struct.unpack("<Q", struct.pack("<d", value))
    return int(bits)


def magnitude_ranges(width: int) -> tuple[tuple[int, int], ...]:
    """Per counted field, in row order (each format's over, then under): ``[low, high)`` bits.

    A value's magnitude bits (its bits with the sign cleared) in ``[low, high)`` are counted:
    overflow is ``(max, inf)``, underflow ``(0, smallest)``. ``width`` is 32 or 64.

    Examples:
        >>> [hex(low) for low, _ in magnitude_ranges(32)[:2]]
        ['0x43e00001', '0x1']
    """
    bits = float32_bits if width == 32 else float64_bits
    infinity = bits(math.inf)
    ranges: list[tuple[int, int]] = []
    for fmt in FORMATS:
        ranges += [(bits(fmt.max) + 1, infinity), (1, bits(fmt.smallest))]
    return tuple(ranges)


def scale_exponent(absmax: float, fmt: Format) -> float:
    """The largest k with ``absmax * 2**k <= fmt.max``; NaN where absmax is 0 or not finite.

    Examples:
        >>> scale_exponent(1.0, format_named("e4m3")), scale_exponent(449.0, format_named("e4m3"))
        (8.0, -1.0)
    """
    if not (0.0 < absmax < math.inf):
        return math.nan
    mantissa, exponent = math.frexp(absmax)
    limit_mantissa, limit_exponent = math.frexp(fmt.max)
    return float(limit_exponent - exponent - (mantissa > limit_mantissa))
