"""Arrow arrays built from their buffers.

``pa.array`` imports pandas the first time it runs, whatever it is given (pyarrow checks each
input for a pandas categorical), and pandas costs 40 MB of resident memory. The writer builds
every array from numpy buffers instead, so that a training process that never used pandas
does not load it for layerscope.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_NUMPY_TYPES = {
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.float64(): np.float64,
}


def numeric(values: np.ndarray, kind: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """``values`` as an Arrow array of ``kind`` (a bool, int or float64 type).

    ``valid`` marks the rows that hold a value; the others are null.
    """
    count = len(values)
    if kind == pa.bool_():
        data = pa.py_buffer(np.packbits(np.asarray(values, dtype=bool), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=_NUMPY_TYPES[kind]))
    return pa.Array.from_buffers(kind, count, [_validity(valid), data])


def strings(values: Sequence[str]) -> pa.Array:
    """Python strings as an Arrow string array."""
    encoded = [value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(value) for value in encoded], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def floats(values: Sequence[float | None]) -> pa.Array:
    """Python floats, None for null, as a float64 array."""
    valid = np.array([value is not None for value in values], dtype=bool)
    data = np.array([value if value is not None else 0.0 for value in values], dtype=np.float64)
    return numeric(data, pa.float64(), valid)


def float_lists(values: Sequence[Sequence[float] | float | None]) -> pa.Array:
    """Lists of floats, None for null, as a list<float64> array; a bare float is a list of one."""
    rows = [[value] if isinstance(value, int | float) else value for value in values]
    lengths = [len(row) if row is not None else 0 for row in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.array([x for row in rows if row is not None for x in row], dtype=np.float64)
    valid = np.array([row is not None for row in rows], dtype=bool)
    return lists(offsets, numeric(flat, pa.float64()), valid)


def lists(offsets: np.ndarray, values: pa.Array, valid: np.ndarray | None = None) -> pa.Array:
    """A list array: row ``i`` holds ``values[offsets[i]:offsets[i + 1]]``, or null.

    Built from buffers: ``pa.ListArray.from_arrays`` with a mask imports ``pyarrow.compute``,
    9 MB of resident memory.
    """
    buffers = [_validity(valid), pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int32))]
    return pa.Array.from_buffers(
        pa.list_(values.type), len(offsets) - 1, buffers, children=[values]
    )


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))
