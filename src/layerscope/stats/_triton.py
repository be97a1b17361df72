"""Partials on a GPU: the Triton kernels of ``_triton_kernels``, launched without a host sync.

One tensor takes two launches, whatever its dtype: ``partials_kernel`` over its blocks and
``finish_kernel``, which writes the row (partials and histogram) into the row buffer. A group
of tensors of one dtype (the parameters, their gradients, the updates) takes the same two
launches for the whole group, plus one non-blocking copy of its table of offsets, sizes and
programs (none when the group's tensors are where they were last time).

triton is imported at the first launch. Where it is missing or a kernel fails to compile,
``reads`` turns false for the rest of the process (one warning says why) and torch's kernels
take over. ``LAYERSCOPE_TRITON=0`` turns the kernels off. Tests run them on CPU tensors in
triton's interpreter (``TRITON_INTERPRET=1``) inside ``on_cpu()``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

from layerscope._errors import LayerscopeWarning
from layerscope.stats import _triton_modes as modes
from layerscope.stats._formats import magnitude_ranges
from layerscope.stats._histogram import HistogramSpec, LinearHistogram, Log2Histogram
from layerscope.stats._layout import HEADROOM_FIELDS, WIDTH, Field

BLOCK = 1024  # elements a program reads at once
INTERPRETED_BLOCK = 64  # in the interpreter, so that small tests span several blocks
PROGRAMS_PER_SM = 4  # a tensor's programs at most, per streaming multiprocessor
INTERPRETED_PROGRAMS = 4
CHUNK = 128  # programs' rows finish_kernel merges at once
SLOT_CHUNK = 64  # histogram slots one finishing program sums
# No fused multiply-add: each product and sum rounds on its own, as in the C kernel
# (-ffp-contract=off) and torch's, so that a value on a linear bin's edge lands in the same
# bin on every device. The kernels are bound by memory, not arithmetic.
LAUNCH = {"enable_fp_fusion": False}

# How the kernel reads each dtype (fp8 by name: older torch lacks some of them).
_FLOAT_KINDS = {
    torch.float32: modes.FLOAT,
    torch.float16: modes.FLOAT,
    torch.float64: modes.FLOAT64,
    torch.bfloat16: modes.BF16,
}
_FP8_KINDS = {"float8_e4m3fn": modes.E4M3, "float8_e5m2": modes.E5M2}
_INTEGER_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
}

_state: dict[str, object] = {"on_cpu": False, "error": None}


def problem() -> str | None:
    """Why the kernels are not used on a GPU, or None where they are."""
    if os.environ.get("LAYERSCOPE_TRITON", "1") == "0":
        return "LAYERSCOPE_TRITON=0"
    error = _state["error"]
    if error is not None:
        return str(error)
    return None if _kernels() is not None else "triton is not installed"


def reads(x: Tensor) -> bool:
    """Whether the kernels compute the partials of ``x``: on CUDA, a dtype they read."""
    device = x.device.type
    if device != "cuda" and not (device == "cpu" and _state["on_cpu"]):
        return False
    return _kind(x.dtype) is not None and problem() is None


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """Run the GPU path on CPU tensors (in triton's interpreter): for tests only."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("on_cpu: set TRITON_INTERPRET=1 before triton is imported")
    before = _state["on_cpu"]
    _state["on_cpu"] = True
    try:
        yield
    finally:
        _state["on_cpu"] = before


def partials_into(x: Tensor, histogram: HistogramSpec | None, rows: Tensor, index: int) -> None:
    """Write the partials and histogram of ``x`` into ``rows[index]``: two launches.

    ``rows`` is the float64 row buffer on ``x``'s device: ``WIDTH`` partials, then the
    histogram's slots (none where ``histogram`` is None).
    """
    kernels = _kernels()
    assert kernels is not None
    flat, kind = _readable(x)
    numel = flat.numel()
    block, most = _sizes(x.device)
    programs = min(-(-numel // block), most)
    hist, slots_pow2 = _histogram_mode(histogram, kind)
    parts = _parts(kernels, programs, x.device)
    hists = _hists(programs, slots_pow2, hist, parts)
    if programs:
        kernels.partials_kernel[(programs,)](
            flat, numel, parts, parts, parts, parts, hists, _linear(histogram, x.device, parts),
            _ranges(kind, x.device),
            KIND=kind, HISTOGRAM=hist, SLOTS_POW2=slots_pow2, GROUP=False, BLOCK=block, **LAUNCH,
        )  # fmt: skip
    _finish(kernels, rows, index, 1, numel, programs, None, parts, hists, hist, slots_pow2)


def group_partials_into(
    tensors: Sequence[Tensor], histogram: HistogramSpec | None, rows: Tensor, first: int
) -> None:
    """Write the partials of each of ``tensors`` into ``rows[first + i]``: two launches.

    The tensors share a device and a dtype that ``reads``.
    """
    kernels = _kernels()
    assert kernels is not None
    group = _group(tensors)
    device = tensors[0].device
    hist, slots_pow2 = _histogram_mode(histogram, group.kind)
    parts = _parts(kernels, group.programs, device)
    hists = _hists(group.programs, slots_pow2, hist, parts)
    if group.programs:
        kernels.partials_kernel[(group.programs,)](
            group.flats[0], 0, group.offsets, group.sizes, group.program_table, parts, hists,
            _linear(histogram, device, parts), _ranges(group.kind, device),
            KIND=group.kind, HISTOGRAM=hist, SLOTS_POW2=slots_pow2, GROUP=True, BLOCK=group.block,
            **LAUNCH,
        )  # fmt: skip
    _finish(kernels, rows, first, len(tensors), 0, 0, (group.sizes, group.firsts), parts, hists,
            hist, slots_pow2)  # fmt: skip


def group_extremes_into(tensors: Sequence[Tensor], pairs: Tensor) -> None:
    """Write the (min, max) of each of ``tensors`` into ``pairs[i]``: two launches.

    As ``torch.aminmax``: over every element, Inf included, both NaN where one is NaN. The
    tensors are floating, not empty, and share a device and a dtype that ``reads``;
    ``pairs`` is a contiguous ``(len(tensors), 2)`` float64 matrix on their device.
    """
    kernels = _kernels()
    assert kernels is not None
    group = _group(tensors)
    parts = torch.empty(group.programs, 3, dtype=torch.float64, device=pairs.device)
    kernels.extremes_kernel[(group.programs,)](
        group.flats[0], group.offsets, group.sizes, group.program_table, parts,
        KIND=group.kind, BLOCK=group.block, **LAUNCH,
    )  # fmt: skip
    kernels.extremes_finish_kernel[(len(tensors),)](
        group.firsts, parts, pairs, CHUNK=CHUNK, **LAUNCH
    )


class _Group(NamedTuple):
    """A group's tensors as the kernels read them, and its table's parts on their device."""

    flats: tuple[Tensor, ...]
    kind: int
    block: int
    offsets: Tensor  # each tensor's offset in elements from the first
    sizes: Tensor  # each tensor's numel
    firsts: Tensor  # each tensor's first program, and one more entry: the programs in all
    program_table: Tensor  # per program: its tensor, that tensor's first program, its programs
    programs: int


def _group(tensors: Sequence[Tensor]) -> _Group:
    device = tensors[0].device
    flats, kinds = zip(*(_readable(t) for t in tensors), strict=True)
    block, most = _sizes(device)
    table, programs = _group_table(flats, block, most, device)
    count = len(flats)
    offsets, sizes = table[:count], table[count : 2 * count]
    firsts, program_table = table[2 * count : 3 * count + 1], table[3 * count + 1 :]
    return _Group(flats, kinds[0], block, offsets, sizes, firsts, program_table, programs)


def disable(error: BaseException) -> None:
    """A kernel failed: use torch's kernels from now on, and say so once."""
    if _state["error"] is not None:
        return
    _state["error"] = f"{type(error).__name__}: {error}"
    warnings.warn(
        f"layerscope: the Triton statistics kernel failed ({_state['error']}); statistics on "
        "the GPU use torch's kernels from now on, which launch more kernels per tensor",
        LayerscopeWarning,
        stacklevel=3,
    )


def _finish(
    kernels: ModuleType,
    rows: Tensor,
    first: int,
    count: int,
    numel: int,
    programs: int,
    group: tuple[Tensor, Tensor] | None,
    parts: Tensor,
    hists: Tensor,
    hist: int,
    slots_pow2: int,
) -> None:
    """Launch finish_kernel into ``count`` rows from ``rows[first]``.

    Of one tensor (``numel``, ``programs``) or of a group (its table's ``sizes``, ``firsts``).
    """
    row_width = rows.shape[1]
    slots = row_width - WIDTH
    parts_of_row = 1 + (-(-slots // SLOT_CHUNK) if hist else 0)
    sizes, firsts = group if group is not None else (parts, parts)
    kernels.finish_kernel[(count, parts_of_row)](
        numel, programs, sizes, firsts, parts, hists, rows[first], row_width, slots,
        HISTOGRAM=hist, SLOTS_POW2=slots_pow2, GROUP=group is not None, CHUNK=CHUNK,
        SLOT_CHUNK=SLOT_CHUNK, **LAUNCH,
    )  # fmt: skip


def _readable(x: Tensor) -> tuple[Tensor, int]:
    """``x`` as a 1-D tensor of elements the kernel loads, and how it decodes them."""
    kind = _kind(x.dtype)
    assert kind is not None
    if x.is_contiguous() or _dense(x):
        # Statistics do not depend on order: a dense layout is read as its memory is.
        flat = x.detach().as_strided((x.numel(),), (1,))
    else:
        flat = x.detach().reshape(-1)  # a copy: a view that skips memory
    if x.dtype == torch.bool or kind in (modes.E4M3, modes.E5M2):
        flat = flat.view(torch.uint8)  # read as bits: booleans and float8
    elif kind == modes.BF16:
        flat = flat.view(torch.int16)  # bfloat16 as bits
    return flat, kind


def _dense(x: Tensor) -> bool:
    """Whether ``x``'s elements fill its memory without gaps or overlaps (channels last)."""
    return (
        x.is_contiguous(memory_format=torch.channels_last)
        if x.dim() == 4
        else (x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d))
    )


def _kind(dtype: torch.dtype) -> int | None:
    kind = _FLOAT_KINDS.get(dtype)
    if kind is not None:
        return kind
    if dtype in _INTEGER_DTYPES:
        return modes.INTEGER
    return _FP8_KINDS.get(str(dtype).removeprefix("torch."))


def _histogram_mode(histogram: HistogramSpec | None, kind: int) -> tuple[int, int]:
    """The kernel's histogram mode and its slots' power of two."""
    if histogram is None or kind == modes.INTEGER:
        return modes.NO_HISTOGRAM, 1
    if isinstance(histogram, Log2Histogram):
        return modes.SIGNED_LOG2 if histogram.signed else modes.LOG2, histogram.slots
    return modes.LINEAR, 1 << (histogram.slots - 1).bit_length()


def _parts(kernels: ModuleType, programs: int, device: torch.device) -> Tensor:
    """Each program's partials, before finish_kernel merges them (one row at least)."""
    width = kernels.PART_WIDTH.value
    return torch.empty(max(programs, 1), width, dtype=torch.float64, device=device)


def _hists(programs: int, slots_pow2: int, hist: int, parts: Tensor) -> Tensor:
    if not hist:
        return parts  # not read
    return torch.empty(max(programs, 1), slots_pow2, dtype=torch.int32, device=parts.device)


@functools.lru_cache(maxsize=16)
def _linear_constants(spec: LinearHistogram, device: torch.device) -> Tensor:
    values = [spec.lo, spec.hi, spec.bins / (spec.hi - spec.lo), (spec.hi - spec.lo) / spec.bins]
    return _to_device(torch.tensor([*values, float(spec.bins)], dtype=torch.float64), device)


def _linear(histogram: HistogramSpec | None, device: torch.device, unused: Tensor) -> Tensor:
    if isinstance(histogram, LinearHistogram):
        return _linear_constants(histogram, device)
    return unused


@functools.lru_cache(maxsize=16)
def _ranges(kind: int, device: torch.device) -> Tensor:
    """The formats' magnitude bits that ``kind``'s values are counted in: ``(2, 8)`` int64."""
    ranges = magnitude_ranges(64 if kind == modes.FLOAT64 else 32)
    host = torch.tensor(list(zip(*ranges, strict=True)), dtype=torch.int64)
    return _to_device(host, device)


_tables: OrderedDict[tuple[object, ...], tuple[Tensor, int]] = OrderedDict()
_TABLES_KEPT = 16


def _group_table(
    flats: Sequence[Tensor], block: int, most: int, device: torch.device
) -> tuple[Tensor, int]:
    """The group's table on its device, and its programs in all.

    int64: each tensor's offset in elements from the first, each one's numel, each one's
    first program and one more entry for the end, then per program its tensor, its tensor's
    first program and its tensor's programs. Kept while the tensors stay where they are.
    """
    itemsize = flats[0].element_size()
    base = flats[0].data_ptr()
    key = (device, itemsize, block, tuple((f.data_ptr(), f.numel()) for f in flats))
    kept = _tables.get(key)
    if kept is not None:
        _tables.move_to_end(key)
        return kept
    offsets, sizes, firsts, program_table = [], [], [0], []
    for tensor, flat in enumerate(flats):
        offset, rest = divmod(flat.data_ptr() - base, itemsize)
        assert rest == 0, "a tensor's memory is aligned to its element size"
        offsets.append(offset)
        sizes.append(flat.numel())
        programs = min(-(-flat.numel() // block), most)
        program_table += [tensor, firsts[-1], programs] * programs
        firsts.append(firsts[-1] + programs)
    host = torch.tensor(offsets + sizes + firsts + program_table, dtype=torch.int64)
    table = (_to_device(host, device), firsts[-1])
    _tables[key] = table
    if len(_tables) > _TABLES_KEPT:
        _tables.popitem(last=False)
    return table


def _to_device(host: Tensor, device: torch.device) -> Tensor:
    """``host`` on ``device`` without a sync: a non-blocking copy from pinned memory."""
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


@functools.lru_cache(maxsize=8)
def _sizes(device: torch.device) -> tuple[int, int]:
    """A program's block and a tensor's programs at most, on ``device``."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRETED_BLOCK, INTERPRETED_PROGRAMS
    processors = torch.cuda.get_device_properties(device).multi_processor_count
    return BLOCK, PROGRAMS_PER_SM * processors


@functools.cache
def _kernels() -> ModuleType | None:
    try:
        kernels = importlib.import_module("layerscope.stats._triton_kernels")
    except ImportError:
        return None
    named = [f for f in Field if f not in HEADROOM_FIELDS]  # those, from ROW_HEADROOM on
    fields = [(f.name, int(f)) for f in named]
    declared = [(f.name, getattr(kernels, f"ROW_{f.name}").value) for f in named]
    assert fields == declared, "the kernel's row layout is stats._layout.Field's"
    assert kernels.ROW_HEADROOM.value == HEADROOM_FIELDS[0]
    assert kernels.ROW_WIDTH.value == WIDTH
    return kernels
