"""Records as Arrow tables and back.

Histograms are stored trimmed: ``hist`` holds the counts from the first to the last non-zero
slot and ``hist_lo`` the slot of its first element. A 256-slot log2 histogram of a real
tensor spans a few dozen slots, so this keeps the store small; readers widen it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from layerscope._modules import CallEvent
from layerscope._table import Chunk

_DICTIONARY_COLUMNS = ("phase", "module", "module_type", "kind", "tensor", "dtype")
_INT_COLUMNS = {
    "step": pa.int64(),
    "rank": pa.int32(),
    "call": pa.int32(),
    "numel": pa.int64(),
    "nan_count": pa.int64(),
    "inf_count": pa.int64(),
}

SCALARS_SCHEMA = pa.schema([("step", pa.int64()), ("name", pa.string()), ("value", pa.float64())])
ALERTS_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("rule", pa.string()),
        ("module", pa.string()),
        ("kind", pa.string()),
        ("severity", pa.string()),
        ("message", pa.string()),
    ]
)
CALLS_SCHEMA = pa.schema(
    [("seq", pa.int64()), ("event", pa.string()), ("module", pa.string()), ("call", pa.int32())]
)


def stats_table(chunk: Chunk) -> pa.Table:
    """One chunk of finalised statistics as an Arrow table."""
    arrays: dict[str, pa.Array] = {}
    for name, column in chunk.columns.items():
        values = column.numpy() if hasattr(column, "numpy") else column
        if name in _INT_COLUMNS:
            arrays[name] = pa.array(np.asarray(values), type=_INT_COLUMNS[name])
        elif name == "shape":
            arrays[name] = _shape_array(list(values))
        elif name in _DICTIONARY_COLUMNS:
            arrays[name] = pa.array(values, type=pa.string())
        elif isinstance(values, np.ndarray):
            arrays[name] = pa.array(values, type=pa.float64())
        else:
            arrays[name] = _custom_array(values)
    if chunk.hist is not None:
        arrays["hist_lo"], arrays["hist"] = _trimmed_histogram(
            chunk.hist.numpy(), np.asarray(chunk.hist_valid, dtype=bool)
        )
    return pa.table(arrays)


def _shape_array(shapes: Sequence[tuple[int, ...]]) -> pa.Array:
    """Shapes repeat from step to step: convert each distinct one once."""
    codes: dict[tuple[int, ...], int] = {}
    index = [codes.setdefault(shape, len(codes)) for shape in shapes]
    distinct = pa.array([list(shape) for shape in codes], type=pa.list_(pa.int64()))
    return distinct.take(pa.array(index, type=pa.int32()))


def _custom_array(values: Sequence[Any]) -> pa.Array:
    if any(isinstance(value, list) for value in values):
        return pa.array(values, type=pa.list_(pa.float64()))
    return pa.array(values, type=pa.float64())


def _trimmed_histogram(counts: np.ndarray, valid: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """``(hist_lo, hist)`` arrays: each row's counts from its first to last non-zero slot.

    Histogram rows are wide (256 slots) and mostly zero, so the search for the first and last
    non-zero slot runs on the mask packed into bits, and only a window as wide as the widest
    row is gathered.
    """
    rows, slots = counts.shape
    packed = np.packbits(counts != 0, axis=1)  # (rows, slots / 8), first slot in the top bit
    occupied = packed != 0
    has_any = occupied.any(axis=1) & valid
    index = np.arange(rows)
    first_byte = occupied.argmax(axis=1)
    last_byte = packed.shape[1] - 1 - occupied[:, ::-1].argmax(axis=1)
    lo = first_byte * 8 + _LEADING_ZEROS[packed[index, first_byte]]
    hi = last_byte * 8 + 8 - _TRAILING_ZEROS[packed[index, last_byte]]
    lo = np.where(has_any, lo, 0)
    lengths = np.where(has_any, np.minimum(hi, slots) - lo, 0)
    width = int(lengths.max(initial=0))
    # Flat positions of each row's window; those past the row's own length are masked out.
    positions = (index * slots + lo)[:, None] + np.arange(width)
    wanted = positions[np.arange(width) < lengths[:, None]]
    values = pa.array(np.take(counts.reshape(-1), wanted), type=pa.int64())
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    hist = pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~valid))
    return pa.array(lo.astype(np.int16), type=pa.int16(), mask=~valid), hist


def _zero_bits_table() -> tuple[np.ndarray, np.ndarray]:
    """Leading and trailing zero bits of every byte (8 for the zero byte)."""
    leading = np.full(256, 8, dtype=np.int64)
    trailing = np.full(256, 8, dtype=np.int64)
    for byte in range(1, 256):
        leading[byte] = 8 - byte.bit_length()
        trailing[byte] = (byte & -byte).bit_length() - 1
    return leading, trailing


_LEADING_ZEROS, _TRAILING_ZEROS = _zero_bits_table()


def widen_histograms(frame: Any, slots: int) -> None:
    """Replace ``hist_lo`` and the trimmed ``hist`` of a stats DataFrame by full count arrays."""
    if "hist" not in frame:
        return
    full: list[np.ndarray | None] = []
    for lo, counts in zip(frame["hist_lo"], frame["hist"], strict=True):
        if counts is None or (isinstance(lo, float) and np.isnan(lo)):
            full.append(None)
            continue
        row = np.zeros(slots, dtype=np.int64)
        start = int(lo)
        row[start : start + len(counts)] = counts
        full.append(row)
    frame["hist"] = full
    del frame["hist_lo"]


def scalars_table(rows: list[tuple[int, str, float]]) -> pa.Table:
    """Scalars as an Arrow table."""
    steps, names, values = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table([list(steps), list(names), list(values)], schema=SCALARS_SCHEMA)


def calls_table(calls: list[CallEvent]) -> pa.Table:
    """The call order as an Arrow table."""
    return pa.table(
        [
            [c.seq for c in calls],
            [c.event for c in calls],
            [c.module for c in calls],
            [c.call for c in calls],
        ],
        schema=CALLS_SCHEMA,
    )
