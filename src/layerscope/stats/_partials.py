"""Partials of one tensor, computed on the tensor's own device with no host sync.

Every function here takes a tensor and returns device tensors; none reads a value back. Branches
depend only on dtype and numel, which are metadata, never on data.
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
from layerscope._stance import compiled_allowed
from layerscope.stats import _native
from layerscope.stats._histogram import HistogramSpec, LinearHistogram, Log2Histogram
from layerscope.stats._layout import EMPTY_ROW, WIDTH, Field

_INF = float("inf")
_FIELDS = tuple(Field)  # row order, as a constant torch.compile folds
# Smallest exponent (as torch.frexp gives it) whose inverse power of two is finite.
_MIN_EXPONENT = {torch.float32: -126, torch.float64: -1022}


def tensor_partials(x: Tensor, histogram: HistogramSpec | None) -> tuple[Tensor, Tensor | None]:
    """Mergeable partials of ``x``: a float64 row of ``WIDTH`` fields and an int64 histogram.

    Floating tensors are read as float32 (float64 stays float64) with NaN and Inf masked out
    of mean, M2, min and max and counted apart; sums are accumulated in float64. Integer,
    boolean and complex tensors get counts only: numel, zeros and signs; their moments stay
    empty and they have no histogram.

    Args:
        x: any tensor; it is read, never modified.
        histogram: which histogram to count, or None for none.

    Returns:
        ``(row, hist)``: ``row`` has shape ``(WIDTH,)`` and dtype float64, ``hist`` has shape
        ``(histogram.slots,)`` and dtype int64, or is None.

    Example:
        >>> from layerscope.stats import Field, Log2Histogram
        >>> row, hist = tensor_partials(torch.tensor([1.0, -2.0, float("nan")]), Log2Histogram())
        >>> row[Field.COUNT].item(), row[Field.MEAN].item(), row[Field.NAN].item()
        (2.0, -0.5, 1.0)
    """
    with torch.no_grad():
        flat = x.detach().reshape(-1)
        if not flat.is_floating_point():
            return _count_partials(flat), None
        if _native_reads(flat, histogram):
            slots = 0 if histogram is None else histogram.slots
            out = torch.empty(1, WIDTH + slots, dtype=torch.float64)
            _native.partials_into(flat, out, 0, histogram)
            return out[0, :WIDTH], None if histogram is None else out[0, WIDTH:].long()
        missing = _native_missing(flat, histogram)
        row, hist = _torch_partials(flat, histogram, quiet=missing)
        if missing:
            _warn_native_missing()
        return row, hist


def _torch_partials(
    flat: Tensor, histogram: HistogramSpec | None, quiet: bool
) -> tuple[Tensor, Tensor | None]:
    """``tensor_partials`` of a flat floating tensor by torch's kernels.

    ``quiet``: a failure to compile is left to the C kernel's warning, which names it.
    """
    if flat.dtype != torch.float64:
        flat = flat.float()
    if flat.numel() == 0:
        return _empty_partials(flat.device), _empty_histogram(histogram, flat.device)
    if flat.dtype == torch.float64:
        row = _float_partials(flat)
    elif isinstance(histogram, Log2Histogram):  # the bins come out of the same pass
        row, bins = _fused_float32(flat, with_bins=True, quiet=quiet)
        return row, _count_bins(bins, histogram.slots)
    else:
        row = _fused_float32(flat, with_bins=False, quiet=quiet)
    hist = _histogram(flat, histogram) if histogram is not None else None
    return row, hist


def write_partials(x: Tensor, histogram: HistogramSpec | None, rows: Tensor, index: int) -> None:
    """Write what ``tensor_partials`` returns into ``rows[index]``: the row, then the histogram.

    ``rows`` is a contiguous float64 matrix of ``WIDTH + histogram.slots`` columns (``WIDTH``
    with no histogram) on ``x``'s device, such as the recorder's buffer. On the CPU the C
    kernel writes there directly, with nothing allocated.
    """
    if x.is_floating_point() and _native_reads(x, histogram):
        _native.partials_into(x, rows, index, histogram)
        return
    row, hist = tensor_partials(x, histogram)
    rows[index, :WIDTH] = row
    if hist is not None:
        rows[index, WIDTH:] = hist


def write_extremes(x: Tensor, pairs: Tensor, index: int) -> None:
    """Write the minimum and maximum of a non-empty floating ``x`` into ``pairs[index]``.

    NaN anywhere makes both NaN, as ``torch.aminmax``. ``pairs`` is a contiguous ``(n, 2)``
    float64 matrix on ``x``'s device. On the CPU the C kernel reads float32, bf16, fp16 and
    fp8 tensors in one vectorised pass and writes there directly.
    """
    if _native_reads(x, None):
        _native.extremes_into(x, pairs, index)
        return
    with torch.no_grad():
        low, high = torch.aminmax(x.detach())
    pairs[index, 0] = low
    pairs[index, 1] = high
    if _native_missing(x, None):
        _warn_native_missing()


def kernel_name(device_type: str = "cpu") -> str:
    """Which kernel computes the statistics of floating tensors on ``device_type``, for run.json.

    ``"native-avx512"``, ``"native-avx2"`` or ``"native"``: the C kernel's AVX-512, AVX2 or
    portable copy (the CPU only; float64 tensors take torch's kernels there too);
    ``"compiled"``: the ``torch.compile``d kernel; ``"eager"``: torch's eager kernel, where
    compiling failed or ``LAYERSCOPE_COMPILE=0``. Until a torch kernel first runs,
    ``"compiled"`` means the one that will be tried. Where the C kernel is missing, the first
    recorded step warns once and says why.

    Example:
        >>> kernel_name("cpu") in ("native-avx512", "native-avx2", "native", "compiled", "eager")
        True
    """
    if device_type == "cpu":
        native = _native.kernel_name()
        if native is not None:
            return native
    if _compile_state == "failed" or os.environ.get("LAYERSCOPE_COMPILE", "1") == "0":
        return "eager"
    return "compiled"


def _native_reads(flat: Tensor, histogram: HistogramSpec | None) -> bool:
    """Whether the C kernel computes these partials."""
    return _native_could_read(flat, histogram) and _native.library() is not None


def _native_could_read(flat: Tensor, histogram: HistogramSpec | None) -> bool:
    """Whether the C kernel, where there is one, computes these partials.

    It reads non-empty floating tensors on the CPU other than float64 (whose own precision the
    torch kernel keeps), with any histogram or none.
    """
    return (
        flat.device.type == "cpu"
        and _native.reads(flat.dtype)
        and flat.numel() > 0
        and _native.reads_histogram(histogram)
        and _native.owns_memory(flat)
    )


_native_warned = False


def _native_missing(flat: Tensor, histogram: HistogramSpec | None) -> bool:
    """Whether the C kernel should have read ``flat`` but is missing, and nobody said so yet."""
    return (
        not _native_warned
        and _native_could_read(flat, histogram)
        and _native.problem() is not None  # None: LAYERSCOPE_NATIVE=0, a choice
    )


def _warn_native_missing() -> None:
    """Say once that statistics on the CPU are slower than they should be, and why."""
    global _native_warned
    _native_warned = True
    if kernel_name("cpu") == "compiled":
        instead = "the torch.compile'd kernel, about 10 times slower"
    else:
        instead = "the eager torch kernel, about 50 times slower"
        if _compile_error is not None:
            instead += f" (torch.compile failed: {_compile_error})"
    warnings.warn(
        f"layerscope: the C statistics kernel is missing: {_native.problem()}. Statistics on "
        f"the CPU use {instead}. Reinstall layerscope where a C compiler is on PATH (`pip "
        "install --force-reinstall --no-deps --no-binary layerscope layerscope`, or `pip "
        "install .` in a checkout), or set LAYERSCOPE_BUILD_NATIVE=1 to build it at first "
        "use; LAYERSCOPE_NATIVE=0 turns it off and silences this",
        LayerscopeWarning,
        stacklevel=3,
    )


def _float32_partials(x: Tensor) -> Tensor:
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
        }
    )


def _row(fields: dict[Field, Tensor]) -> Tensor:
    """A float64 row of every field's value, in row order (a field left out raises)."""
    return torch.stack([fields[field].to(torch.float64) for field in _FIELDS])


def _float32_partials_and_bins(x: Tensor) -> tuple[Tensor, Tensor]:
    """``_float32_partials`` and each value's log2 slot (uint8), from one pass."""
    return _float32_partials(x), _log2_bin_index(x).to(torch.uint8)


def _float_partials(x: Tensor) -> Tensor:
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
        }
    )


# torch.compile fuses the passes of _float32_partials (and the log2 bins) into one loop: on a
# 2-core CPU about 1 ms per million float32 elements instead of 18 ms eager. It compiles once
# per process (about 10 s on that CPU, plus ~2 s for sizes 0 and 1) and falls back to eager
# where it cannot compile. LAYERSCOPE_COMPILE=0 keeps the eager kernel.
_KERNELS: dict[bool, Callable[[Tensor], Any]] = {
    False: _float32_partials,
    True: _float32_partials_and_bins,
}
_compiled: dict[bool, Callable[[Tensor], Any]] = {}
_compile_state = "untried"  # "untried", "ready" or "failed"
_compile_error: str | None = None  # why compiling failed, where it ran and failed
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


def _fused_float32(x: Tensor, with_bins: bool, quiet: bool = False) -> Any:
    """The float32 kernel, with the log2 bins if asked for; compiled where possible.

    ``quiet``: a failure to compile is not warned of here (the caller's warning names it).
    """
    global _compile_state, _compile_error
    if _compile_state == "untried":
        _compile_state = "failed"
        if os.environ.get("LAYERSCOPE_COMPILE", "1") != "0":
            try:
                for bins, eager in _KERNELS.items():
                    _compiled[bins] = torch.compile(eager, dynamic=True)
                _compile_state = "ready"
            except Exception:  # no compiler backend here: eager it is
                _compiled.clear()
    compiled = _compiled.get(with_bins)
    if compiled is None:
        return _KERNELS[with_bins](x.contiguous())
    try:
        return _run_compiled(compiled, x.contiguous())
    except Exception as error:
        _compiled.clear()
        _compile_state = "failed"
        _compile_error = f"{type(error).__name__}: {error}"
        if not quiet:
            warnings.warn(
                f"layerscope: compiling the statistics kernel failed ({_compile_error}); "
                "using the eager kernel, which is slower",
                LayerscopeWarning,
                stacklevel=2,
            )
        return _KERNELS[with_bins](x.contiguous())


def _count_partials(x: Tensor) -> Tensor:
    """Counts of a non-floating tensor: numel, zeros and signs; no moments."""
    row = _empty_partials(x.device)
    numel = x.numel()
    row[Field.NUMEL] = numel
    if numel == 0:
        return row
    nonzero = torch.count_nonzero(x)
    row[Field.ZEROS] = numel - nonzero
    if x.dtype == torch.bool or x.is_complex():  # no sign: every nonzero counts as positive
        row[Field.POS] = nonzero
    else:
        neg = torch.count_nonzero(x < 0)
        row[Field.NEG] = neg
        row[Field.POS] = nonzero - neg
    return row


def _empty_partials(device: torch.device) -> Tensor:
    return torch.tensor(EMPTY_ROW, dtype=torch.float64, device=device)


def _empty_histogram(histogram: HistogramSpec | None, device: torch.device) -> Tensor | None:
    if histogram is None:
        return None
    return torch.zeros(histogram.slots, dtype=torch.int64, device=device)


def _histogram(x: Tensor, histogram: HistogramSpec) -> Tensor:
    if isinstance(histogram, LinearHistogram):
        index = _linear_bin_index(x, histogram)
    else:
        index = _log2_bin_index(x)
    return _count_bins(index, histogram.slots)


def _log2_bin_index(x: Tensor) -> Tensor:
    """Biased float32 exponent of each value: 0 zero/subnormal, 255 non-finite."""
    if x.dtype == torch.float64:
        # Rebias the float64 exponent onto float32's bins; finite values beyond float32's range
        # land in the outermost finite bins rather than among the non-finite.
        exponent = (x.view(torch.int64) >> 52) & 0x7FF
        index = (exponent - (1023 - 127)).clamp(0, 254)
        return torch.where(torch.isfinite(x), index, 255)
    # int32 indices: bincount and index_add_ take them, and widening costs a pass.
    return (x.view(torch.int32) >> 23) & 0xFF


def _linear_bin_index(x: Tensor, spec: LinearHistogram) -> Tensor:
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


def _count_bins(index: Tensor, slots: int) -> Tensor:
    """Exact int64 counts of each slot; one extra slot takes what is to be dropped."""
    size = slots + 1
    if index.device.type == "cpu":  # uint8 indices (log2 bins) count fastest
        # On CPU bincount is ~2x faster than index_add_ and has no device to sync with.
        counts = torch.bincount(index, minlength=size)
    else:
        # On CUDA bincount reads min and max back to the host; index_add_ does not.
        counts = torch.zeros(size, dtype=torch.int64, device=index.device)
        index = index.int() if index.dtype == torch.uint8 else index  # index_add_ wants ints
        counts.index_add_(0, index, torch.ones_like(index, dtype=torch.int64))
    return counts[:slots]
