"""Heat map frames: a tensor as an image, 4-D ones as a grid of channels, shrunk by block means.

numpy in float64 on one tensor at a time; matplotlib only in ``heatmap_frames``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

# Kinds whose 2-D tensors are (out, in) matrices rather than (samples, features).
WEIGHT_KINDS = frozenset(("weight", "weight_grad", "update"))
# The "bad" colour of a heat map: NaN, and the gaps between the tiles of a 4-D tensor.
NAN_COLOUR = "0.55"


@dataclass(frozen=True, slots=True)
class HeatImage:
    """What a heat map shows of one tensor.

    Attributes:
        image: (rows, columns) float64, shrunk by block means to at most ``max_side`` a side;
            NaN in the gaps between tiles.
        rows: rows before shrinking (the axes count these).
        columns: columns before shrinking.
    """

    image: np.ndarray
    rows: int
    columns: int


def channel_grid(channels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C, H, W) channels as tiles in a grid, left to right then down, one pixel apart.

    ``ceil(sqrt(C))`` tiles a row. Returns the image (NaN between tiles) and a mask that is
    True where a channel's element is.

    Examples:
        >>> image, present = channel_grid(np.arange(12.0).reshape(3, 2, 2))
        >>> image.shape, int(present.sum())
        ((5, 5), 12)
    """
    count, height, width = channels.shape
    columns = math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    image = np.full((rows * (height + 1) - 1, columns * (width + 1) - 1), np.nan)
    present = np.zeros(image.shape, dtype=bool)
    for index in range(count):
        row, column = divmod(index, columns)
        top, left = row * (height + 1), column * (width + 1)
        image[top : top + height, left : left + width] = channels[index]
        present[top : top + height, left : left + width] = True
    return image, present


def heatmap_plane(tensor: Tensor, max_channels: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The 2-D image of ``tensor`` (see ``HeatMap``) and, for 4-D, where its tiles are."""
    dims = tensor.dim()
    if dims <= 1:
        return to_float64(tensor).reshape(1, -1), None
    if dims == 2:
        return to_float64(tensor), None
    if dims == 3:  # (batch, seq, hidden): the first sample
        return to_float64(tensor[0]), None
    if dims == 4:  # (N, C, H, W): the first sample's channels
        return channel_grid(to_float64(tensor[0, :max_channels]))
    return to_float64(tensor[0].reshape(-1, tensor.shape[-1])), None


def block_mean(image: np.ndarray, present: np.ndarray | None, max_side: int) -> np.ndarray:
    """``image`` shrunk to at most ``max_side`` a side by means of blocks.

    Blocks are ``ceil(side / max_side)`` elements in each direction; the last of a side may
    be partial, and its mean is of the elements it holds. Elements where ``present`` is False
    (gaps) are not counted; a block of gaps alone is NaN. A NaN element makes its block NaN.

    Examples:
        >>> block_mean(np.arange(10.0).reshape(1, 10), None, 4)
        array([[1., 4., 7., 9.]])
    """
    rows, columns = image.shape
    row_factor = -(-rows // max_side)
    column_factor = -(-columns // max_side)
    if row_factor == 1 and column_factor == 1:
        return image
    kept = np.ones(image.shape, dtype=bool) if present is None else present
    shrunk_rows, shrunk_columns = -(-rows // row_factor), -(-columns // column_factor)
    sums = np.zeros((shrunk_rows * row_factor, shrunk_columns * column_factor))
    counts = np.zeros(sums.shape)
    sums[:rows, :columns] = np.where(kept, image, 0.0)
    counts[:rows, :columns] = kept
    blocks = (shrunk_rows, row_factor, shrunk_columns, column_factor)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf is NaN, as it should be
        total = sums.reshape(blocks).sum(axis=(1, 3))
        number = counts.reshape(blocks).sum(axis=(1, 3))
        shrunk: np.ndarray = np.where(number > 0, total / np.maximum(number, 1), np.nan)
    return shrunk


def heatmap_image(tensor: Tensor, max_side: int, max_channels: int) -> HeatImage:
    """What ``HeatMap`` shows of ``tensor``."""
    plane, present = heatmap_plane(tensor, max_channels)
    rows, columns = plane.shape
    return HeatImage(block_mean(plane, present, max_side), rows, columns)


def symmetric_limit(image: np.ndarray) -> float:
    """The largest finite magnitude in ``image``; 0 if none."""
    finite = np.abs(image[np.isfinite(image)])
    return float(finite.max()) if finite.size else 0.0


def heatmap_labels(tensor: Tensor, kind: str | None, max_channels: int) -> tuple[str, str]:
    """The x and y labels of a heat map of ``tensor``."""
    dims = tensor.dim()
    if dims <= 1:
        return "index", ""
    if dims == 2:
        if kind in WEIGHT_KINDS:
            return "input feature", "output feature"
        if kind is not None:
            return "feature", "sample"
        return "dim 1", "dim 0"
    if dims == 3:
        return "hidden", "position (sample 0)"
    if dims == 4:
        channels, height, width = tensor.shape[1:]
        shown = min(channels, max_channels)
        return f"sample 0: {shown} of {channels} channels, tiles of {height} x {width}", ""
    return "last dimension", "sample 0, other dimensions as rows"


def heatmap_frames(
    values: list[Tensor | Record],
    size: tuple[float, float] | None,
    dpi: float | None,
    *,
    max_side: int,
    max_channels: int,
    cmap: str,
) -> TensorFrames:
    """Heat maps of ``values``, colour limits +-(largest finite magnitude of all of them).

    Images are made again when drawn (the last one made is kept), so memory does not grow
    with the number of frames.
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.ticker import MaxNLocator

    tensors = [tensor_of(value) for value in values]
    made: dict[int, HeatImage] = {}

    def image_of(index: int) -> HeatImage:
        if index not in made:
            made.clear()
            made[index] = heatmap_image(tensors[index], max_side, max_channels)
        return made[index]

    limit, rows, columns = 0.0, 1, 1
    for index in range(len(tensors)):
        shown = image_of(index)
        limit = max(limit, symmetric_limit(shown.image))
        rows, columns = max(rows, shown.rows), max(columns, shown.columns)
    limit = limit if limit > 0 else 1.0

    fig, ax = new_axes(size, dpi)
    colour_map = colormaps[cmap].with_extremes(bad=NAN_COLOUR)
    image = ax.imshow(
        np.zeros((1, 1)),
        cmap=colour_map,
        norm=Normalize(-limit, limit),
        interpolation="nearest",
        aspect="auto",
    )
    ax.set_xlim(-0.5, columns - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    first = values[0]
    kind = first.kind if isinstance(first, Record) else None
    xlabel, ylabel = heatmap_labels(tensors[0], kind, max_channels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if tensors[0].dim() <= 1:
        ax.set_yticks([])
    fig.colorbar(image, ax=ax, label="value")
    titles = Titles(fig, ax, values, tensors)

    def draw(index: int) -> None:
        shown = image_of(index)
        image.set_data(shown.image)
        image.set_extent((-0.5, shown.columns - 0.5, shown.rows - 0.5, -0.5))
        shrunk = shown.image.shape != (shown.rows, shown.columns)
        note = f"block means {shown.image.shape[0]} x {shown.image.shape[1]}" if shrunk else ""
        titles.show(index, note, str(non_finite(tensors[index])))

    moving: list[Artist] = [image, titles.caption]
    return TensorFrames(figure=fig, moving=moving, draw=draw, count=len(values))
