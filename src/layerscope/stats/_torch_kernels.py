"""torch's kernels for the partials: wherever the C kernel does not read the tensor.

Every device: float64 reductions in the tensor's own dtype; float32 in one pass with float64
sums (``float32_partials``), fused by ``torch.compile`` with the log2 bins (split by sign or
not) where it compiles; the histograms' bin indices and counts. None reads a value back to the host.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from layerscope._errors import LayerscopeWarning
from layerscope.stats._formats import magnitude_ranges
from layerscope.stats._histogram import LOG2_BINS, HistogramSpec, LinearHistogram
from layerscope.stats._layout import HEADROOM_FIELDS, Field
from layerscope.stats._stance import compiled_allowed

_INF = float("inf")
_FIELDS = tuple(Field)  # row order, as a constant torch.compile folds
# Smallest exponent (as torch.frexp gives it) whose inverse power of two is finite.
_MIN_EXPONENT = {torch.float32: -126, torch.float64: -1022}
# Bits of float32 and float64 values as integers, and the magnitude ranges counted in them.
_BITS = {torch.float32: (torch.int32, 0x7FFFFFFF), torch.float64: (torch.int64, 2**63 - 1)}
_RANGES = {torch.float32: magnitude_ranges(32), torch.float64: magnitude_ranges(64)}


def headroom_counts(x: Tensor) -> dict[Field, Tensor]:
    """Per format, the values of a float32 or float64 ``x`` it cannot hold (``_formats``).

    Compared as integer bits: exact, and unchanged by a flush-to-zero mode.
    """
    integer, sign_clear = _BITS[x.dtype]
    magnitude = x.view(integer) & sign_clear
    return {
        field: torch.count_nonzero((magnitude >= low) & (magnitude < high))
        for field, (low, high) in zip(HEADROOM_FIELDS, _RANGES[x.dtype], strict=True)
    }


def float32_partials(x: Tensor) -> Tensor:
    """Partials of a non-empty 1-D float32 tensor, in one pass over it.

    Sums run in float64 on values shifted by the first element (0 if not finite): float32's
    squares can neither overflow nor underflow there, so no rescaling pass is needed, and the
    shift keeps ``sum(d**2) - sum(d)**2 / n`` from cancelling: where the first element is far
    from the mean, M2 is at least as large as that distance squared.
    """
    numel = x.numel()
    finite = x.abs() < _INF  # NaN compares false too
    nan = torch.count_nonzero(torch.isnan(x))
    count = torch.count_nonzero(finite)
    # The first element, or 0 where it is not finite (the C kernel looks further: here that
    # would take a pass of its own, and float64's pairwise sums keep the error small).
    first = x[0].double()
    shift = torch.where(first.abs() < _INF, first, 0.0)
    deviation = torch.where(finite, x.double() - shift, 0.0)
    total = deviation.sum()
    squares = (deviation * deviation).sum()
    lo = torch.where(finite, x, _INF).amin()
    hi = torch.where(finite, x, -_INF).amax()
    zeros = numel - torch.count_nonzero(x)
    pos = torch.count_nonzero(x > 0)
    count_f = count.double().clamp(min=1.0)
    return _row(
        {
            Field.NUMEL: torch.ones((), dtype=torch.float64, device=x.device) * numel,
            Field.COUNT: count,
            Field.MEAN: shift + total / count_f,
            Field.M2: (squares - total * total / count_f).clamp(min=0.0),
            Field.MIN: lo,
            Field.MAX: hi,
            Field.ZEROS: zeros,
            Field.NAN: nan,
            Field.INF: numel - count - nan,
            Field.NEG: numel - zeros - nan - pos,  # NaN is neither; -inf is negative
            Field.POS: pos,
            **headroom_counts(x),
        }
    )


def _row(fields: dict[Field, Tensor]) -> Tensor:
    """A float64 row of every field's value, in row order (a field left out raises)."""
    return torch.stack([fields[field].to(torch.float64) for field in _FIELDS])


def float32_partials_and_bins(x: Tensor) -> tuple[Tensor, Tensor]:
    """``float32_partials`` and each value's log2 slot (uint8), from one pass."""
    return float32_partials(x), log2_bin_index(x).to(torch.uint8)


def float32_partials_and_signed_bins(x: Tensor) -> tuple[Tensor, Tensor]:
    """``float32_partials`` and each value's slot of the signed log2 histogram (int16)."""
    return float32_partials(x), log2_bin_index(x, signed=True).to(torch.int16)


def float_partials(x: Tensor) -> Tensor:
    """Partials of a non-empty 1-D float64 (or float32) tensor, reduced in its own dtype."""
    numel = x.numel()
    # isfinite is a composite of four passes on CPU; NaN compares false here too.
    finite = x.abs() < _INF
    count = torch.count_nonzero(finite)
    nan = torch.count_nonzero(torch.isnan(x))
    lo = torch.where(finite, x, _INF).amin()
    hi = torch.where(finite, x, -_INF).amax()

    # Scale by a power of two so that squares neither overflow (|x| > 1.8e19 in float32) nor
    # underflow (|x| < 1e-19); the scaling is exact and undone in float64 below.
    absmax = torch.maximum(lo.abs(), hi.abs())
    absmax = torch.where(count > 0, absmax, 0.0)
    _, exponent = torch.frexp(absmax)
    # Below the smallest normal exponent 2**-exponent would overflow; subnormals keep less.
    exponent = exponent.clamp(min=_MIN_EXPONENT[x.dtype])
    inv_scale = torch.pow(2.0, -exponent.to(x.dtype))
    scaled = torch.where(finite, x * inv_scale, 0.0)
    count_f = count.to(x.dtype)
    mean_scaled = scaled.sum() / count_f.clamp(min=1.0)
    # Corrected two-pass sum of squares: the second term removes the error of the first mean.
    deviation = torch.where(finite, scaled - mean_scaled, 0.0)
    dev_sum = deviation.sum()
    m2_scaled = (deviation * deviation).sum() - dev_sum * dev_sum / count_f.clamp(min=1.0)

    # Undo the scaling in two halves: 2**1024 alone overflows float64.
    half = torch.div(exponent, 2, rounding_mode="floor").to(torch.float64)
    scale_a = torch.pow(2.0, half)
    scale_b = torch.pow(2.0, exponent.to(torch.float64) - half)
    zeros = numel - torch.count_nonzero(x)
    pos = torch.count_nonzero(x > 0)
    neg = numel - zeros - nan - pos  # NaN is neither; -inf is negative
    return _row(
        {
            Field.NUMEL: torch.ones((), dtype=torch.float64, device=x.device) * numel,
            Field.COUNT: count,
            # Corrected mean, summed in float64: float32's ulp at 1e4 is 1e-3.
            Field.MEAN: (mean_scaled.double() + dev_sum.double() / count_f.clamp(min=1.0).double())
            * scale_a
            * scale_b,
            Field.M2: m2_scaled.clamp(min=0.0).to(torch.float64)
            * scale_a
            * scale_a
            * scale_b
            * scale_b,
            Field.MIN: lo,
            Field.MAX: hi,
            Field.ZEROS: zeros,
            Field.NAN: nan,
            Field.INF: numel - count - nan,
            Field.NEG: neg,
            Field.POS: pos,
            **headroom_counts(x),
        }
    )


# torch.compile fuses the passes of float32_partials (and the log2 bins) into one loop: on a
# 2-core CPU about 1 ms per million float32 elements instead of 18 ms eager. It compiles once
# per process (about 10 s on that CPU, plus ~2 s for sizes 0 and 1) and falls back to eager
# where it cannot compile. LAYERSCOPE_COMPILE=0 keeps the eager kernel.
# Keyed by (with_bins, signed).
KERNELS: dict[tuple[bool, bool], Callable[[Tensor], Any]] = {
    (False, False): float32_partials,
    (True, False): float32_partials_and_bins,
    (True, True): float32_partials_and_signed_bins,
}
_compiled: dict[tuple[bool, bool], Callable[[Tensor], Any]] = {}
compile_state = "untried"  # "untried", "ready" or "failed"
compile_error: str | None = None  # why compiling failed, where it ran and failed
_own_graphs = 0  # graphs dynamo made for this kernel, told apart from the user's own compiles


def own_graph_count() -> int:
    """How many of dynamo's graphs in this process are this kernel's, not the user's."""
    return _own_graphs


def _run_compiled(compiled: Callable[[Tensor], Any], x: Tensor) -> Any:
    """``compiled(x)``, counting the graphs its (re)compiles add."""
    global _own_graphs
    stats = sys.modules["torch._dynamo.utils"].counters["stats"]
    before = stats["unique_graphs"]
    try:
        with compiled_allowed():  # also on a recorded step that runs the model eagerly
            return compiled(x)
    finally:
        _own_graphs += stats["unique_graphs"] - before


def fused_float32(x: Tensor, with_bins: bool, quiet: bool = False, signed: bool = False) -> Any:
    """The float32 kernel, with the log2 bins if asked for; compiled where possible.

    ``quiet``: a failure to compile is not warned of here (the caller's warning names it).
    ``signed``: the bins are the signed log2 histogram's (``log2_bin_index``).
    """
    global compile_state, compile_error
    key = (with_bins, with_bins and signed)
    if compile_state == "untried":
        compile_state = "failed"
        if os.environ.get("LAYERSCOPE_COMPILE", "1") != "0":
            try:
                for bins, eager in KERNELS.items():
                    _compiled[bins] = torch.compile(eager, dynamic=True)
                compile_state = "ready"
            except Exception:  # no compiler backend here: eager it is
                _compiled.clear()
    compiled = _compiled.get(key)
    if compiled is None:
        return KERNELS[key](x.contiguous())
    try:
        return _run_compiled(compiled, x.contiguous())
    except Exception as error:
        _compiled.clear()
        compile_state = "failed"
        compile_error = f"{type(error).__name__}: {error}"
        if not quiet:
            warnings.warn(
                f"layerscope: compiling the statistics kernel failed ({compile_error}); "
                "using the eager kernel, which is slower",
                LayerscopeWarning,
                stacklevel=2,
            )
        return KERNELS[key](x.contiguous())


def histogram_counts(x: Tensor, histogram: HistogramSpec) -> Tensor:
    if isinstance(histogram, LinearHistogram):
        index = linear_bin_index(x, histogram)
    else:
        index = log2_bin_index(x, signed=histogram.signed)
    return count_bins(index, histogram.slots)


def log2_bin_index(x: Tensor, signed: bool = False) -> Tensor:
    """Biased float32 exponent of each value: 0 zero/subnormal, 255 non-finite.

    ``signed``: plus 256 where the sign bit is set (-0.0, -inf and NaN with it set too).
    """
    if x.dtype == torch.float64:
        # Rebias the float64 exponent onto float32's bins; finite values beyond float32's range
        # land in the outermost finite bins rather than among the non-finite.
        bits = x.view(torch.int64)
        index = (((bits >> 52) & 0x7FF) - (1023 - 127)).clamp(0, 254)
        index = torch.where(torch.isfinite(x), index, 255)
        return index + (bits < 0).long() * LOG2_BINS if signed else index
    # int32 indices: bincount and index_add_ take them, and widening costs a pass. The top
    # nine bits are the sign and the exponent.
    return (x.view(torch.int32) >> 23) & (0x1FF if signed else 0xFF)


def linear_bin_index(x: Tensor, spec: LinearHistogram) -> Tensor:
    """Slot of each value: 0 underflow, 1..bins, bins+1 overflow, bins+2 NaN (dropped).

    Computed in float64 and checked against the edges, as numpy does: rounding in
    ``(x - lo) * scale`` can put a value next to an edge one bin off.
    """
    x = x.double()
    bins = spec.bins
    position = torch.floor((x - spec.lo) * (bins / (spec.hi - spec.lo))).clamp(-1.0, bins)
    position = torch.where(torch.isnan(x), 0.0, position)
    position = position - ((position >= 0) & (x < _linear_edge(position, spec))).double()
    position = position + ((position < bins) & (x >= _linear_edge(position + 1, spec))).double()
    # NaN compares false everywhere: park it past the overflow slot, then drop that slot.
    position = torch.where(torch.isnan(x), float(bins + 1), position)
    return (position + 1).long()


def _linear_edge(k: Tensor, spec: LinearHistogram) -> Tensor:
    """Lower edge of bin ``k``: ``lo + k * width``, and exactly ``hi`` for ``k == bins``."""
    width = (spec.hi - spec.lo) / spec.bins
    return torch.where(k >= spec.bins, spec.hi, spec.lo + k.clamp(min=0.0) * width)


def count_bins(index: Tensor, slots: int) -> Tensor:
    """Exact int64 counts of each slot; one extra slot takes what is to be dropped."""
    size = slots + 1
    if index.device.type == "cpu":  # uint8 indices (log2 bins) count fastest
        # On CPU bincount is ~2x faster than index_add_ and has no device to sync with.
        counts = torch.bincount(index, minlength=size)
    else:
        # On CUDA bincount reads min and max back to the host; index_add_ does not.
        counts = torch.zeros(size, dtype=torch.int64, device=index.device)
        # index_add_ wants int32 or int64 indices
        index = index.int() if index.dtype in (torch.uint8, torch.int16) else index
        counts.index_add_(0, index, torch.ones_like(index, dtype=torch.int64))
    return counts[:slots]
