"""Partials of one tensor, computed on the tensor's own device with no host sync.

Every function here takes a tensor and returns device tensors; none reads a value back. Branches
depend only on dtype and numel, which are metadata, never on data.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

from layerscope._errors import LayerscopeWarning
from layerscope.stats import _native, _triton
from layerscope.stats import _torch_kernels as kernels
from layerscope.stats._histogram import HistogramSpec, Log2Histogram
from layerscope.stats._layout import WIDTH, Field

_INF = float("inf")


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

    Examples:
        >>> from layerscope.stats import Field, Log2Histogram
        >>> row, hist = tensor_partials(torch.tensor([1.0, -2.0, float("nan")]), Log2Histogram())
        >>> row[Field.COUNT].item(), row[Field.MEAN].item(), row[Field.NAN].item()
        (2.0, -0.5, 1.0)
    """
    with torch.no_grad():
        if _triton.reads(x):
            slots = 0 if histogram is None else histogram.slots
            out = torch.empty(1, WIDTH + slots, dtype=torch.float64, device=x.device)
            if _triton_wrote(x, histogram, out, 0):
                return out[0, :WIDTH], None if histogram is None else out[0, WIDTH:].long()
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
        row = kernels.float_partials(flat)
    elif isinstance(histogram, Log2Histogram):  # the bins come out of the same pass
        signed = histogram.signed
        row, bins = kernels.fused_float32(flat, with_bins=True, quiet=quiet, signed=signed)
        return row, kernels.count_bins(bins, histogram.slots)
    else:
        row = kernels.fused_float32(flat, with_bins=False, quiet=quiet)
    hist = kernels.histogram_counts(flat, histogram) if histogram is not None else None
    return row, hist


def write_partials(x: Tensor, histogram: HistogramSpec | None, rows: Tensor, index: int) -> None:
    """Write what ``tensor_partials`` returns into ``rows[index]``: the row, then the histogram.

    ``rows`` is a contiguous float64 matrix of ``WIDTH + histogram.slots`` columns (``WIDTH``
    with no histogram) on ``x``'s device, such as the recorder's buffer. On the CPU the C
    kernel writes there directly, with nothing allocated.
    """
    if _triton.reads(x) and _triton_wrote(x, histogram, rows, index):
        return
    if x.is_floating_point() and _native_reads(x, histogram):
        _native.partials_into(x, rows, index, histogram)
        return
    row, hist = tensor_partials(x, histogram)
    rows[index, :WIDTH] = row
    if hist is not None:
        rows[index, WIDTH:] = hist


def write_group_partials(
    tensors: list[Tensor], histogram: HistogramSpec | None, rows: Tensor, first: int
) -> None:
    """Write the partials of each of ``tensors`` into ``rows[first + i]``, as ``write_partials``.

    Where the Triton kernels read them (on a GPU: tensors of one device and dtype), one
    launch pair computes them all; elsewhere each tensor is read on its own.
    """
    if tensors and _triton.reads(tensors[0]):
        try:
            with torch.no_grad():
                _triton.group_partials_into(tensors, histogram, rows, first)
            return
        except Exception as error:  # a kernel that does not compile here: torch's from now on
            _triton.disable(error)
    for offset, tensor in enumerate(tensors):
        write_partials(tensor, histogram, rows, first + offset)


def write_group_extremes(tensors: list[Tensor], pairs: Tensor) -> None:
    """Write the (min, max) of each of ``tensors`` into ``pairs[i]``, as ``write_extremes``.

    Where the Triton kernels read them (on a GPU: tensors of one device and dtype), one
    launch pair reads them all; elsewhere each tensor is read on its own.
    """
    if tensors and _triton.reads(tensors[0]):
        try:
            with torch.no_grad():
                _triton.group_extremes_into(tensors, pairs)
            return
        except Exception as error:  # a kernel that does not compile here: torch's from now on
            _triton.disable(error)
    for index, tensor in enumerate(tensors):
        write_extremes(tensor, pairs, index)


def group_reads(x: Tensor) -> bool:
    """Whether ``write_group_partials`` reads ``x`` with others of its device and dtype at once."""
    return _triton.reads(x)


def _triton_wrote(x: Tensor, histogram: HistogramSpec | None, rows: Tensor, index: int) -> bool:
    """Write the partials of ``x`` with the Triton kernels; False where they failed."""
    try:
        with torch.no_grad():
            _triton.partials_into(x, histogram, rows, index)
        return True
    except Exception as error:
        _triton.disable(error)
        return False


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
    ``"triton"``: the Triton kernels (CUDA only, where triton imports and they compiled);
    ``"compiled"``: the ``torch.compile``d kernel; ``"eager"``: torch's eager kernel, where
    compiling failed or ``LAYERSCOPE_COMPILE=0``. Until a torch kernel first runs,
    ``"compiled"`` means the one that will be tried. Where the C kernel is missing, the first
    recorded step warns once and says why.

    Examples:
        >>> kernel_name("cpu") in ("native-avx512", "native-avx2", "native", "compiled", "eager")
        True
    """
    if device_type == "cpu":
        native = _native.kernel_name()
        if native is not None:
            return native
    elif device_type == "cuda" and _triton.problem() is None:
        return "triton"
    if kernels.compile_state == "failed" or os.environ.get("LAYERSCOPE_COMPILE", "1") == "0":
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
        if kernels.compile_error is not None:
            instead += f" (torch.compile failed: {kernels.compile_error})"
    warnings.warn(
        f"layerscope: the C statistics kernel is missing: {_native.problem()}. Statistics on "
        f"the CPU use {instead}. Reinstall layerscope where a C compiler is on PATH (`pip "
        "install --force-reinstall --no-deps --no-binary layerscope layerscope`, or `pip "
        "install .` in a checkout), or set LAYERSCOPE_BUILD_NATIVE=1 to build it at first "
        "use; LAYERSCOPE_NATIVE=0 turns it off and silences this",
        LayerscopeWarning,
        stacklevel=3,
    )


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
    # Filled on the device: a row made from a host list is a copy that syncs on a GPU.
    row = torch.zeros(WIDTH, dtype=torch.float64, device=device)
    for field in Field:
        if field.empty != 0.0:
            row[field] = field.empty
    return row


def _empty_histogram(histogram: HistogramSpec | None, device: torch.device) -> Tensor | None:
    if histogram is None:
        return None
    return torch.zeros(histogram.slots, dtype=torch.int64, device=device)
