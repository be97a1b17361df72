"""One figure redrawn for each of several tensors: ``TensorFrames`` and what every kind shares.

Each renderer of ``layerscope.tensors`` builds ``TensorFrames``: one figure whose limits hold
every value, and a ``draw(index)`` that changes only the artists that move. Here are that
result and what every kind of frame uses: a value as a tensor and as float64 numpy, its
non-finite count, its heading and caption, the figure's axes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from layerscope.tensors._records import Record

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Room around the points of a scatter, as a share of their range.
MARGIN = 0.05


@dataclass(kw_only=True, eq=False)
class TensorFrames:
    """One figure redrawn for each of several tensors, its limits and axes fixed over all.

    Attributes:
        figure: the figure; its layout is fixed, so each frame has the same axes.
        moving: the artists that ``draw`` changes; everything else is the same in every frame
            (blitting draws it once).
        draw: ``draw(index)`` sets the moving artists to the ``index``-th value.
        count: how many values (frames).
    """

    figure: Figure
    moving: list[Artist]
    draw: Callable[[int], None]
    count: int

    def __len__(self) -> int:
        return self.count


def tensor_of(value: Tensor | Record) -> Tensor:
    """The tensor of a Record or a Tensor, checked to be drawable."""
    if isinstance(value, Record):
        tensor = value.value
        if not isinstance(tensor, Tensor):
            raise TypeError(
                f"value: the record holds a {type(tensor).__name__}, not a tensor (what its "
                f"stash or stash_value returned); only tensors are drawn"
            )
    elif isinstance(value, Tensor):
        tensor = value
    else:
        raise TypeError(
            f"value: expected a Tensor or a layerscope.tensors.Record, got {type(value).__name__}"
        )
    if tensor.is_complex():
        raise TypeError("value: a complex tensor is not drawn; pass its .abs() or .real")
    if tensor.numel() == 0:
        raise ValueError(
            f"value: an empty tensor (shape {tuple(tensor.shape)}) has nothing to draw"
        )
    return tensor.detach()


def to_float64(tensor: Tensor) -> np.ndarray:
    """``tensor`` as a float64 numpy array on the host."""
    return tensor.detach().to(device="cpu", dtype=torch.float64).numpy()


@dataclass(frozen=True, slots=True)
class NonFinite:
    """How many elements of a tensor are NaN, +Inf and -Inf."""

    nan: int
    positive: int
    negative: int

    def __str__(self) -> str:
        parts = [
            f"{label} {count}"
            for label, count in (
                ("NaN", self.nan),
                ("+Inf", self.positive),
                ("-Inf", self.negative),
            )
            if count
        ]
        return ", ".join(parts)


def non_finite(tensor: Tensor) -> NonFinite:
    """Counts of NaN, +Inf and -Inf in ``tensor``."""
    if not tensor.is_floating_point():
        return NonFinite(0, 0, 0)
    return NonFinite(
        int(torch.isnan(tensor).sum()),
        int(torch.isposinf(tensor).sum()),
        int(torch.isneginf(tensor).sum()),
    )


def heading_of(value: Tensor | Record, tensor: Tensor) -> str:
    """What the tensor is, and its shape: ``blocks.0 activation out (8 x 16)``."""
    shape = " x ".join(str(size) for size in tensor.shape) or "scalar"
    if isinstance(value, Record):
        return f"{value.module or '(root)'} {value.kind} {value.tensor} ({shape})"
    return f"tensor ({shape})"


def caption_of(value: Tensor | Record, index: int, count: int, *notes: str) -> str:
    """Where a frame's tensor is from (step, phase, call), then ``notes``."""
    if isinstance(value, Record):
        where = [f"step {value.step}", value.phase]
        if value.call:
            where.append(f"call {value.call}")
        if value.count > 1:
            where.append(f"reduces {value.count}")
    else:
        where = [f"frame {index + 1} of {count}"] if count > 1 else []
    return ", ".join([*where, *(note for note in notes if note)])


class Titles:
    """A title the frames share and a caption under it that changes from frame to frame.

    The title is what the tensor is (module, kind, tensor, shape) when every frame's is the
    same, and is drawn once; the caption says the step and notes, and is all that is drawn
    again (text is most of the cost of a frame). Both are fixed in place just above the axes,
    which have nothing above them to make room for.
    """

    def __init__(
        self, fig: Figure, axes: Axes, values: list[Tensor | Record], tensors: list[Tensor]
    ) -> None:
        from matplotlib.transforms import ScaledTranslation

        self.values = values
        self.headings = [heading_of(v, t) for v, t in zip(values, tensors, strict=True)]
        self.shared = self.headings[0] if len(set(self.headings)) == 1 else ""
        self.title = axes.set_title(self.shared, fontsize="medium", y=1.0, pad=16)
        lift = ScaledTranslation(0, 3 / 72, fig.dpi_scale_trans)
        self.caption = axes.text(
            0.5, 1.0, "", transform=axes.transAxes + lift, ha="center", va="bottom",
            fontsize="small",
        )  # fmt: skip

    def show(self, index: int, *notes: str) -> None:
        """Set the caption to frame ``index``'s."""
        caption = caption_of(self.values[index], index, len(self.values), *notes)
        if not self.shared:
            caption = f"{self.headings[index]}, {caption}" if caption else self.headings[index]
        self.caption.set_text(caption)


def new_axes(size: tuple[float, float] | None, dpi: float | None) -> tuple[Figure, Axes]:
    """A figure without pyplot (matplotlib's default size where ``size`` is None), one axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    return fig, fig.add_subplot()


def padded_range(low: float, high: float) -> tuple[float, float]:
    """``(low, high)`` widened by ``MARGIN`` of its width; (-1, 1) around a single value."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return -1.0, 1.0
    if high <= low:
        return low - 1.0, high + 1.0
    room = (high - low) * MARGIN
    return low - room, high + room
