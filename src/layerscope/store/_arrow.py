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
from layerscope._table import IDENTITY_COLUMNS, Chunk, Identities

# The statistics that are counts; the others are float64.
_COUNT_STATS = frozenset(("numel", "nan_count", "inf_count"))

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
    """One chunk of finalised statistics as an Arrow table.

    Key columns are taken by code from Arrow arrays of the identities and forms, built once
    per new identity rather than once per row.
    """
    lookup = _identity_arrays(chunk.identities)
    identity, form = pa.array(chunk.identity.numpy()), pa.array(chunk.form.numpy())
    arrays: dict[str, pa.Array] = {
        "step": pa.array(chunk.step.numpy(), type=pa.int64()),
        "phase": lookup["phase"].take(identity),
        "rank": pa.array(np.full(len(chunk), chunk.rank, dtype=np.int32)),
    }
    for name in ("module", "module_type", "kind", "tensor", "call"):
        arrays[name] = lookup[name].take(identity)
    for name in ("dtype", "shape"):
        arrays[name] = lookup[name].take(form)
    for name, column in chunk.stats.items():
        kind = pa.int64() if name in _COUNT_STATS else pa.float64()
        arrays[name] = pa.array(column.numpy(), type=kind)
    for name, values in chunk.custom.items():
        arrays[name] = _custom_array(values)
    if chunk.hist is not None:
        valid = lookup["has_histogram"][chunk.form.numpy()]
        arrays["hist_lo"], arrays["hist"] = _trimmed_histogram(chunk.hist.numpy(), valid)
    return pa.table(arrays)


def _identity_arrays(identities: Identities) -> dict[str, Any]:
    """Arrow arrays of every identity's and form's columns, rebuilt when new ones appeared."""
    rows, forms = identities.identities, identities.forms
    count = (len(rows), len(forms))
    cached = identities.cache.get("arrow")
    if cached is not None and cached[0] == count:
        lookup: dict[str, Any] = cached[1]
        return lookup
    rows, forms = rows[: count[0]], forms[: count[1]]
    lookup = {
        name: pa.array([row[position] for row in rows], type=pa.string())
        for position, name in enumerate(IDENTITY_COLUMNS)
        if name not in ("kind", "call")
    }
    lookup["kind"] = pa.array([row.kind.value for row in rows], type=pa.string())
    lookup["call"] = pa.array([row.call for row in rows], type=pa.int32())
    lookup["dtype"] = pa.array([form.dtype for form in forms], type=pa.string())
    lookup["shape"] = pa.array([list(form.shape) for form in forms], type=pa.list_(pa.int64()))
    lookup["has_histogram"] = np.array([form.has_histogram for form in forms], dtype=bool)
    identities.cache["arrow"] = (count, lookup)
    return lookup


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
    values = pa.array(np.take(counts.reshape(-1), wanted).astype(np.int64), type=pa.int64())
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
