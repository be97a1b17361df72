"""The GPU kernels: every partial of a tensor and its histogram in one pass, in its own dtype.

Two launches compute the partials of one tensor, or of a whole group of tensors of one dtype
(a table of element offsets from the group's first tensor):

- ``partials_kernel``: each program reads blocks of ``BLOCK`` elements, decodes them to float32
  (float64 stays float64), and keeps count, mean and M2 of the finite values in float64
  (each block's mean and M2 from the block itself, merged into the program's by Chan's
  formula), their minimum and maximum, the counts of zeros, NaN, Inf and signs, and its own
  histogram (``tl.histogram``, no atomics). It writes one row of these per program.
- ``finish_kernel``: one program per tensor merges its programs' rows (Chan again) into the
  tensor's row of partials, written straight into the device row buffer; further programs sum
  the histograms' columns.

Nothing is copied to float first, nothing is read back: the grid's size depends on numel only.
Importing this module imports triton; ``_triton.py`` does that only when a kernel is needed.
How the values are decoded, binned and compared with the formats' limits: ``_triton_values``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from layerscope.stats import _triton_modes as modes
from layerscope.stats._triton_values import (
    HEADROOM,
    decode,
    headroom_counts,
    linear_slots,
    log2_slots,
    power_of_two,
    signed_log2_slots,
)

# Globals that kernels read must be constexpr: _triton_modes' values, and the layouts.

FLOAT64 = tl.constexpr(modes.FLOAT64)
INTEGER = tl.constexpr(modes.INTEGER)
NO_HISTOGRAM = tl.constexpr(modes.NO_HISTOGRAM)
LOG2 = tl.constexpr(modes.LOG2)
LINEAR = tl.constexpr(modes.LINEAR)
SIGNED_LOG2 = tl.constexpr(modes.SIGNED_LOG2)

# Columns of a program's row: the partials before merging.
PART_COUNT = tl.constexpr(0)
PART_MEAN = tl.constexpr(1)
PART_M2 = tl.constexpr(2)
PART_MIN = tl.constexpr(3)
PART_MAX = tl.constexpr(4)
PART_ZEROS = tl.constexpr(5)
PART_NAN = tl.constexpr(6)
PART_INF = tl.constexpr(7)
PART_NEG = tl.constexpr(8)
PART_POS = tl.constexpr(9)
PART_HEADROOM = tl.constexpr(10)  # HEADROOM columns: the formats' counts
PART_WIDTH = tl.constexpr(18)

# The row's fields (stats._layout.Field, checked against it by _triton.py).
ROW_NUMEL = tl.constexpr(0)
ROW_COUNT = tl.constexpr(1)
ROW_MEAN = tl.constexpr(2)
ROW_M2 = tl.constexpr(3)
ROW_MIN = tl.constexpr(4)
ROW_MAX = tl.constexpr(5)
ROW_ZEROS = tl.constexpr(6)
ROW_NAN = tl.constexpr(7)
ROW_INF = tl.constexpr(8)
ROW_NEG = tl.constexpr(9)
ROW_POS = tl.constexpr(10)
ROW_HEADROOM = tl.constexpr(11)  # E4M3_OVER, the first of HEADROOM fields in a row
ROW_WIDTH = tl.constexpr(19)


# Triton specialises integer arguments on their values: a size divisible by 16 lets a program
# load 16 bytes at once, and a size of 1 becomes a constant, which has no ``.to``. The
# partials take the first and never call a method on ``numel``; finish_kernel's sizes are
# never specialised (no load depends on them, and each variant is another compile).
@triton.jit
def partials_kernel(
    src,  # the tensor, or the group's first tensor
    numel,  # its number of elements (one tensor)
    offsets,  # int64 per tensor: its elements' offset from src (a group)
    sizes,  # int64 per tensor: its numel (a group)
    programs,  # int64 per program: (tensor, first program of that tensor, its programs)
    parts,  # float64 (programs, PART_WIDTH)
    hists,  # int32 (programs, SLOTS_POW2)
    linear,  # float64 (5,): lo, hi, scale, width, bins
    ranges,  # int64 (2, HEADROOM): the formats' magnitude bits counted, [low, high)
    KIND: tl.constexpr,
    HISTOGRAM: tl.constexpr,
    SLOTS_POW2: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if GROUP:
        tensor = tl.load(programs + 3 * pid)
        first = tl.load(programs + 3 * pid + 1)
        own = tl.load(programs + 3 * pid + 2)
        base = src + tl.load(offsets + tensor)
        n = tl.load(sizes + tensor)
        local = pid - first
    else:
        base = src
        n = numel
        local = pid
        own = tl.num_programs(0)

    count = tl.zeros((), tl.float64)
    mean = tl.zeros((), tl.float64)
    m2 = tl.zeros((), tl.float64)
    low = tl.full((), float("inf"), tl.float64)
    high = tl.full((), float("-inf"), tl.float64)
    zeros = tl.zeros((), tl.int64)
    nans = tl.zeros((), tl.int64)
    infs = tl.zeros((), tl.int64)
    negs = tl.zeros((), tl.int64)
    poss = tl.zeros((), tl.int64)
    hist = tl.zeros((SLOTS_POW2,), tl.int32)
    headroom = tl.zeros((HEADROOM,), tl.int64)
    lanes = tl.arange(0, BLOCK)
    for start in tl.range(local.to(tl.int64) * BLOCK, n, own.to(tl.int64) * BLOCK):
        index = start + lanes
        inside = index < n
        raw = tl.load(base + index, mask=inside, other=0)
        if KIND == INTEGER:
            zeros += tl.sum((inside & (raw == 0)).to(tl.int32), 0)
            negs += tl.sum((inside & (raw < 0)).to(tl.int32), 0)
            poss += tl.sum((inside & (raw > 0)).to(tl.int32), 0)
        else:
            x = decode(raw, KIND)
            finite = inside & (tl.abs(x) < float("inf"))  # NaN compares false too
            nan = inside & (x != x)
            zeros += tl.sum((inside & (x == 0)).to(tl.int32), 0)
            nans += tl.sum(nan.to(tl.int32), 0)
            infs += tl.sum((inside & (tl.abs(x) == float("inf"))).to(tl.int32), 0)
            negs += tl.sum((inside & (x < 0)).to(tl.int32), 0)
            poss += tl.sum((inside & (x > 0)).to(tl.int32), 0)
            low = tl.minimum(low, tl.min(tl.where(finite, x, float("inf")), 0).to(tl.float64))
            high = tl.maximum(high, tl.max(tl.where(finite, x, float("-inf")), 0).to(tl.float64))
            headroom += headroom_counts(x, inside, ranges, KIND)

            # The block's count, mean and M2 in float64, from deviations from its own mean.
            value = tl.where(finite, x.to(tl.float64), 0.0)
            if KIND == FLOAT64:
                # Scaled by a power of two so that no sum or square overflows; exact.
                largest = tl.max(tl.abs(value), 0)
                exponent = ((largest.to(tl.int64, bitcast=True) >> 52) & 0x7FF).to(tl.int32)
                shift = tl.minimum(tl.maximum(1023 - exponent, -1022), 1000)
                value = value * power_of_two(shift)
            block_count = tl.sum(finite.to(tl.int32), 0).to(tl.float64)
            divisor = tl.maximum(block_count, 1.0)
            block_mean = tl.sum(value, 0) / divisor
            deviation = tl.where(finite, value - block_mean, 0.0)
            spread = tl.sum(deviation, 0)  # what rounding left in the mean, removed below
            block_m2 = tl.maximum(tl.sum(deviation * deviation, 0) - spread * spread / divisor, 0.0)
            block_mean += spread / divisor
            if KIND == FLOAT64:
                undo = power_of_two(-shift)
                block_mean = block_mean * undo
                block_m2 = block_m2 * undo * undo

            # Chan: merge the block into the program's partials.
            total = count + block_count
            delta = block_mean - mean
            weight = tl.where(total > 0, block_count / tl.maximum(total, 1.0), 0.0)
            mean += delta * weight
            # count * weight first: 0 for the first block, where delta**2 alone may overflow
            m2 += block_m2 + count * weight * delta * delta
            count = total

            if HISTOGRAM == LOG2:
                hist += tl.histogram(log2_slots(x, KIND), SLOTS_POW2, mask=inside)
            elif HISTOGRAM == SIGNED_LOG2:
                hist += tl.histogram(signed_log2_slots(x, KIND), SLOTS_POW2, mask=inside)
            elif HISTOGRAM == LINEAR:
                slots = linear_slots(x, linear, SLOTS_POW2)
                hist += tl.histogram(slots, SLOTS_POW2, mask=inside & (x == x))

    row = parts + pid.to(tl.int64) * PART_WIDTH
    tl.store(row + PART_COUNT, count)
    tl.store(row + PART_MEAN, mean)
    tl.store(row + PART_M2, m2)
    tl.store(row + PART_MIN, low)
    tl.store(row + PART_MAX, high)
    tl.store(row + PART_ZEROS, zeros.to(tl.float64))
    tl.store(row + PART_NAN, nans.to(tl.float64))
    tl.store(row + PART_INF, infs.to(tl.float64))
    tl.store(row + PART_NEG, negs.to(tl.float64))
    tl.store(row + PART_POS, poss.to(tl.float64))
    tl.store(row + PART_HEADROOM + tl.arange(0, HEADROOM), headroom.to(tl.float64))
    if HISTOGRAM != NO_HISTOGRAM:
        tl.store(hists + pid.to(tl.int64) * SLOTS_POW2 + tl.arange(0, SLOTS_POW2), hist)


@triton.jit(do_not_specialize=["numel", "programs", "row_width", "slots"])
def finish_kernel(
    numel,  # one tensor's numel
    programs,  # one tensor's programs
    sizes,  # int64 per tensor (a group)
    firsts,  # int64 per tensor: its first program; one more entry: the programs in all
    parts,
    hists,
    rows,  # the row of the first tensor in the row buffer (float64)
    row_width,  # the buffer's row length: the partials, then the histogram's slots
    slots,  # the histogram's slots in a row (0: none)
    HISTOGRAM: tl.constexpr,
    SLOTS_POW2: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
    SLOT_CHUNK: tl.constexpr,
):
    tensor = tl.program_id(0)
    part = tl.program_id(1)
    if GROUP:
        first = tl.load(firsts + tensor)
        last = tl.load(firsts + tensor + 1)
    else:
        first = tl.zeros((), tl.int64)
        last = programs.to(tl.int64)
    row = rows + tensor.to(tl.int64) * row_width
    lanes = tl.arange(0, CHUNK)
    if part == 0:
        if GROUP:
            n = tl.load(sizes + tensor)
        else:
            n = numel
        count = tl.zeros((), tl.float64)
        mean = tl.zeros((), tl.float64)
        m2 = tl.zeros((), tl.float64)
        low = tl.full((), float("inf"), tl.float64)
        high = tl.full((), float("-inf"), tl.float64)
        zeros = tl.zeros((), tl.float64)
        nans = tl.zeros((), tl.float64)
        infs = tl.zeros((), tl.float64)
        negs = tl.zeros((), tl.float64)
        poss = tl.zeros((), tl.float64)
        headroom = tl.zeros((HEADROOM,), tl.float64)
        for start in tl.range(first, last, CHUNK):
            program = start + lanes
            inside = program < last
            at = parts + program.to(tl.int64) * PART_WIDTH
            counts = tl.load(at + PART_COUNT, mask=inside, other=0.0)
            means = tl.load(at + PART_MEAN, mask=inside, other=0.0)
            m2s = tl.load(at + PART_M2, mask=inside, other=0.0)
            # The chunk's programs merged at once (Chan for many parts), then into the rest.
            chunk_count = tl.sum(counts, 0)
            divisor = tl.maximum(chunk_count, 1.0)
            chunk_mean = tl.sum(counts * means, 0) / divisor
            spread = means - chunk_mean
            chunk_m2 = tl.sum(m2s, 0) + tl.sum(tl.where(inside, counts * spread * spread, 0.0), 0)
            total = count + chunk_count
            delta = chunk_mean - mean
            weight = tl.where(total > 0, chunk_count / tl.maximum(total, 1.0), 0.0)
            mean += delta * weight
            m2 += chunk_m2 + count * weight * delta * delta
            count = total
            lows = tl.load(at + PART_MIN, mask=inside, other=float("inf"))
            highs = tl.load(at + PART_MAX, mask=inside, other=float("-inf"))
            low = tl.minimum(low, tl.min(lows, 0))
            high = tl.maximum(high, tl.max(highs, 0))
            zeros += tl.sum(tl.load(at + PART_ZEROS, mask=inside, other=0.0), 0)
            nans += tl.sum(tl.load(at + PART_NAN, mask=inside, other=0.0), 0)
            infs += tl.sum(tl.load(at + PART_INF, mask=inside, other=0.0), 0)
            negs += tl.sum(tl.load(at + PART_NEG, mask=inside, other=0.0), 0)
            poss += tl.sum(tl.load(at + PART_POS, mask=inside, other=0.0), 0)
            columns = at[:, None] + PART_HEADROOM + tl.arange(0, HEADROOM)[None, :]
            headroom += tl.sum(tl.load(columns, mask=inside[:, None], other=0.0), 0)
        # The row's fields, in stats._layout.Field's order.
        tl.store(row + ROW_NUMEL, n.to(tl.float64))
        tl.store(row + ROW_COUNT, count)
        tl.store(row + ROW_MEAN, mean)
        tl.store(row + ROW_M2, m2)
        tl.store(row + ROW_MIN, low)
        tl.store(row + ROW_MAX, high)
        tl.store(row + ROW_ZEROS, zeros)
        tl.store(row + ROW_NAN, nans)
        tl.store(row + ROW_INF, infs)
        tl.store(row + ROW_NEG, negs)
        tl.store(row + ROW_POS, poss)
        tl.store(row + ROW_HEADROOM + tl.arange(0, HEADROOM), headroom)
        if HISTOGRAM == NO_HISTOGRAM:  # a tensor without one in a buffer with: zeros
            for start in tl.range(0, slots, SLOT_CHUNK):
                slot = start + tl.arange(0, SLOT_CHUNK)
                empty = tl.zeros((SLOT_CHUNK,), tl.float64)
                tl.store(row + ROW_WIDTH + slot, empty, mask=slot < slots)
    elif HISTOGRAM != NO_HISTOGRAM:
        # Program ``part`` sums the columns of slots [(part - 1) * SLOT_CHUNK, part * SLOT_CHUNK).
        slot = (part - 1) * SLOT_CHUNK + tl.arange(0, SLOT_CHUNK)
        total = tl.zeros((SLOT_CHUNK,), tl.int64)
        for start in tl.range(first, last, CHUNK):
            program = start + lanes
            at = hists + program.to(tl.int64)[:, None] * SLOTS_POW2 + slot[None, :]
            inside = (program < last)[:, None] & (slot < SLOTS_POW2)[None, :]
            total += tl.sum(tl.load(at, mask=inside, other=0).to(tl.int64), 0)
        tl.store(row + ROW_WIDTH + slot, total.to(tl.float64), mask=slot < slots)


@triton.jit
def extremes_kernel(
    src,  # the group's first tensor
    offsets,  # int64 per tensor: its elements' offset from src
    sizes,  # int64 per tensor: its numel
    programs,  # int64 per program: (tensor, first program of that tensor, its programs)
    parts,  # float64 (programs, 3): lowest and highest value that is not NaN, NaN count
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The sentinel's reading of a group of floating tensors: each program's extremes."""
    pid = tl.program_id(0)
    tensor = tl.load(programs + 3 * pid)
    first = tl.load(programs + 3 * pid + 1)
    own = tl.load(programs + 3 * pid + 2)
    base = src + tl.load(offsets + tensor)
    n = tl.load(sizes + tensor)
    low = tl.full((), float("inf"), tl.float64)
    high = tl.full((), float("-inf"), tl.float64)
    nans = tl.zeros((), tl.int64)
    lanes = tl.arange(0, BLOCK)
    for start in tl.range((pid - first).to(tl.int64) * BLOCK, n, own.to(tl.int64) * BLOCK):
        index = start + lanes
        inside = index < n
        x = decode(tl.load(base + index, mask=inside, other=0), KIND)
        number = inside & (x == x)  # Inf included: it is the extreme it is
        nans += tl.sum((inside & (x != x)).to(tl.int32), 0)
        low = tl.minimum(low, tl.min(tl.where(number, x, float("inf")), 0).to(tl.float64))
        high = tl.maximum(high, tl.max(tl.where(number, x, float("-inf")), 0).to(tl.float64))
    row = parts + pid.to(tl.int64) * 3
    tl.store(row, low)
    tl.store(row + 1, high)
    tl.store(row + 2, nans.to(tl.float64))


@triton.jit
def extremes_finish_kernel(
    firsts,  # int64 per tensor: its first program; one more entry: the programs in all
    parts,
    pairs,  # float64 (tensors, 2) from the first tensor's pair: minimum and maximum
    CHUNK: tl.constexpr,
):
    """Each tensor's (min, max) from its programs' extremes; both NaN where it holds a NaN."""
    tensor = tl.program_id(0)
    first = tl.load(firsts + tensor)
    last = tl.load(firsts + tensor + 1)
    low = tl.full((), float("inf"), tl.float64)
    high = tl.full((), float("-inf"), tl.float64)
    nans = tl.zeros((), tl.float64)
    lanes = tl.arange(0, CHUNK)
    for start in tl.range(first, last, CHUNK):
        program = start + lanes
        inside = program < last
        at = parts + program.to(tl.int64) * 3
        low = tl.minimum(low, tl.min(tl.load(at, mask=inside, other=float("inf")), 0))
        high = tl.maximum(high, tl.max(tl.load(at + 1, mask=inside, other=float("-inf")), 0))
        nans += tl.sum(tl.load(at + 2, mask=inside, other=0.0), 0)
    pair = pairs + tensor.to(tl.int64) * 2
    tl.store(pair, tl.where(nans > 0, float("nan"), low))
    tl.store(pair + 1, tl.where(nans > 0, float("nan"), high))
