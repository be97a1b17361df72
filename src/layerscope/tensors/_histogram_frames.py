"""Histogram frames: every value's histogram on the same bins and the same y limit."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from layerscope.tensors._frames import (
    TensorFrames,
    Titles,
    new_axes,
    non_finite,
    tensor_of,
    to_float64,
)
from layerscope.tensors._records import Record

if TYPE_CHECKING:
    from matplotlib.artist import Artist


def finite_values(tensor: Tensor) -> np.ndarray:
    """The finite elements of ``tensor``, flat, float64."""
    flat = to_float64(tensor).reshape(-1)
    finite: np.ndarray = flat[np.isfinite(flat)]
    return finite


def value_edges(tensors: list[Tensor], bins: int) -> np.ndarray:
    """``bins + 1`` equal edges from the smallest finite value of all tensors to the largest.

    Around a single value, one unit wide; (-1, 1) where no value is finite.
    """
    low, high = math.inf, -math.inf
    for tensor in tensors:
        finite = finite_values(tensor)
        if finite.size:
            low, high = min(low, float(finite.min())), max(high, float(finite.max()))
    if low > high:
        low, high = -1.0, 1.0
    elif low == high:
        low, high = low - 0.5, high + 0.5
    return np.linspace(low, high, bins + 1)


def histogram_frames(
    values: list[Tensor | Record],
    size: tuple[float, float] | None,
    dpi: float | None,
    *,
    bins: int,
) -> TensorFrames:
    """Histograms of ``values``, the same bins and y limit for all."""
    tensors = [tensor_of(value) for value in values]
    edges = value_edges(tensors, bins)
    counts = [np.histogram(finite_values(tensor), bins=edges)[0] for tensor in tensors]
    top = max(int(count.max()) for count in counts)

    fig, ax = new_axes(size, dpi)
    bars = ax.stairs(counts[0], edges, fill=True, color="C0")
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(0, top * 1.05 if top > 0 else 1.0)
    ax.set_xlabel("value")
    ax.set_ylabel("elements")
    titles = Titles(fig, ax, values, tensors)

    def draw(index: int) -> None:
        bars.set_data(values=counts[index])
        titles.show(index, str(non_finite(tensors[index])))

    moving: list[Artist] = [bars, titles.caption]
    return TensorFrames(figure=fig, moving=moving, draw=draw, count=len(values))
