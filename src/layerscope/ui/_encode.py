"""Numbers as the page reads them: big matrices packed as base64 float32, small lists as JSON.

A heat map of 200 layers by 1,000 columns is 200,000 numbers: as JSON text that is ~4 MB and
~90 ms to write, packed it is 1 MB and ~2 ms, and the browser reads it into a Float32Array
without parsing. Missing values are NaN in a packed array and ``null`` in a JSON list.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from typing import Any

import numpy as np


def pack(values: np.ndarray) -> dict[str, Any]:
    """``values`` (any shape) as ``{"dtype": "float32", "shape": [...], "base64": ...}``.

    Example:
        >>> pack(np.array([1.0, float("nan")]))["shape"]
        [2]
    """
    array = np.ascontiguousarray(values, dtype="<f4")
    return {
        "dtype": "float32",
        "shape": list(array.shape),
        "base64": base64.b64encode(array.tobytes()).decode("ascii"),
    }


def unpack(packed: dict[str, Any]) -> np.ndarray:
    """The float32 array ``pack`` made (for tests and the report's own checks).

    Example:
        >>> unpack(pack(np.arange(6.0).reshape(2, 3))).tolist()
        [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """
    data = np.frombuffer(base64.b64decode(packed["base64"]), dtype="<f4")
    return data.reshape(packed["shape"])


def numbers(values: Iterable[Any]) -> list[float | None]:
    """Floats for a JSON list: None for NaN, infinities and missing values (JSON has none).

    Example:
        >>> numbers([1, float("nan"), None])
        [1.0, None, None]
    """
    out: list[float | None] = []
    for value in values:
        number = None if value is None else float(value)
        out.append(number if number is not None and math.isfinite(number) else None)
    return out


def integers(values: Iterable[Any]) -> list[int]:
    """Python ints for a JSON list (numpy's int64 is not JSON)."""
    return [int(value) for value in values]
