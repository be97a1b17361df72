"""Histogram specifications: the range-free log2-magnitude histogram and a linear one.

The log2 histogram bins each value by the exponent of its float32 representation, read from the
bits, so it needs no range, counts exactly (int64), and lines up across layers, steps and ranks:

- bin 0: zeros and float32 subnormals (|x| < 2**-126)
- bin k, 1 <= k <= 254: 2**(k-127) <= |x| < 2**(k-126)
- bin 255: +-inf and NaN

bf16 shares float32's exponent, so its dynamic range reads off the same bins directly.

Split by sign (``SignedLog2Histogram``, counted for the trackers that draw signed values), it
has two halves of these slots, read from the top 9 bits of a float32: slot k for values whose
sign bit is clear (+0.0 in slot 0), slot 256 + k for those whose sign bit is set (-0.0 in slot
256, -inf in 511, NaN by its sign bit). The magnitude histogram is the sum of the halves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerscope._limits import MAX_LINEAR_BINS, Bound, check_within

LOG2_BINS = 256
LOG2_EXPONENT_BIAS = 127


@dataclass(frozen=True, slots=True)
class LinearHistogram:
    """Evenly spaced bins over ``[lo, hi)`` plus an underflow and an overflow bin.

    Slot 0 counts values below ``lo`` (-inf included), slots 1..bins the bins, the last slot
    values at or above ``hi`` (+inf included). NaN is counted in ``nan_count`` only.
    """

    lo: float
    hi: float
    bins: int
    signed = False  # it counts values, not magnitudes: no sign split to ask for

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise ValueError(
                f"histogram: expected ('linear', lo, hi, bins) with finite lo < hi, "
                f"got lo={self.lo!r}, hi={self.hi!r}"
            )
        if self.bins < 1:
            raise ValueError(f"histogram: bins must be >= 1, got {self.bins!r}")
        check_within(self.bins, "histogram: bins", Bound(1, MAX_LINEAR_BINS))  # a row a tensor
        span = self.hi - self.lo
        if not (math.isfinite(span) and span / self.bins > 0 and math.isfinite(self.bins / span)):
            raise ValueError(
                f"histogram: ('linear', {self.lo!r}, {self.hi!r}, {self.bins!r}) has bins too "
                f"wide or too narrow for float64"
            )

    @property
    def slots(self) -> int:
        """Length of a histogram row: the bins plus underflow and overflow."""
        return self.bins + 2


class Log2Histogram:
    """The range-free log2-magnitude histogram (see the module docstring)."""

    slots = LOG2_BINS
    signed = False  # the sign split of SignedLog2Histogram

    def __repr__(self) -> str:
        return "Log2Histogram()"


class SignedLog2Histogram(Log2Histogram):
    """The log2 histogram split by sign: ``LOG2_BINS`` slots for each sign (module docstring).

    The recorder counts it in place of the log2 histogram where a sink asks for signed
    histograms; the rows it writes keep the magnitudes, the sum of the two halves.
    """

    slots = 2 * LOG2_BINS
    signed = True

    def __repr__(self) -> str:
        return "SignedLog2Histogram()"


HistogramSpec = Log2Histogram | LinearHistogram


def log2_bin_edges() -> list[float]:
    """Lower magnitude edge of each log2 bin; bin 0 starts at 0 and bin 255 is non-finite.

    Examples:
        >>> edges = log2_bin_edges()
        >>> edges[127], edges[128]
        (1.0, 2.0)
    """
    edges = [0.0]
    edges += [2.0 ** (k - LOG2_EXPONENT_BIAS) for k in range(1, LOG2_BINS - 1)]
    edges.append(math.inf)
    return edges


def signed_log2_bin_edges() -> list[float]:
    """Lower edge of each bin of the log2 histogram drawn over signed values.

    The finite bins in value order: each negative bin k (254 down to 1) is its magnitude bin
    mirrored, ``[-2**(k-126), -2**(k-127))``; then one bin of zeros and subnormals of both
    signs, ``[-2**-126, 2**-126)``; then the positive bins 1 to 254. The first is open below
    (-inf) as the last is above: a sink closes them at the row's min and max. Inf and NaN have
    no bin (they are ``inf_count`` and ``nan_count``).

    Examples:
        >>> edges = signed_log2_bin_edges()
        >>> len(edges), edges[0], edges[127], edges[128], edges[381], edges[382]
        (509, -inf, -2.0, -1.0, 1.0, 2.0)
        >>> edges[254] == -(2.0**-126) and edges[255] == 2.0**-126  # zeros and subnormals
        True
    """
    normal = range(1, LOG2_BINS - 1)  # the magnitude bins of normal values, 1 to 254
    negative = [-(2.0 ** (k - LOG2_EXPONENT_BIAS + 1)) for k in reversed(normal)]
    positive = [2.0 ** (k - LOG2_EXPONENT_BIAS) for k in normal]
    return [-math.inf, *negative[1:], -(2.0 ** (1 - LOG2_EXPONENT_BIAS)), *positive]


def parse_histogram(histogram: object) -> HistogramSpec | None:
    """Turn the ``histogram=`` argument of ``watch`` into a spec, or raise a clear error."""
    if histogram is None:
        return None
    if histogram == "log2":
        return Log2Histogram()
    if (
        isinstance(histogram, tuple)
        and len(histogram) == 4
        and histogram[0] == "linear"
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in histogram[1:])
        and (isinstance(histogram[3], int) or float(histogram[3]).is_integer())
    ):
        _, lo, hi, bins = histogram
        if not all(abs(edge) < 2**1024 for edge in (lo, hi)):  # float() of a larger int raises
            raise ValueError(f"histogram: lo and hi must be finite, got lo={lo!r}, hi={hi!r}")
        return LinearHistogram(float(lo), float(hi), int(bins))
    raise ValueError(
        f"histogram: expected 'log2', ('linear', lo, hi, bins) or None, got {histogram!r}"
    )


def check_fits(start: int, length: int, slots: int) -> None:
    """A ValueError unless a trimmed histogram from slot ``start`` fits in ``slots`` slots.

    Only a damaged or crafted file holds one that does not: say so rather than misplace it.
    """
    if start < 0 or start + length > slots:
        raise ValueError(
            f"hist: a histogram in slots {start} to {start + length - 1} where the run's "
            f"histogram_edges give {slots} slots: the stats files are damaged"
        )
