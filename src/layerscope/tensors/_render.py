"""Renderers of whole tensors: a heat map, a histogram of the values, a PCA scatter.

Each renderer is a small frozen dataclass, so it pickles by value into the worker processes
that run ``watch(on_tensor=...)`` callbacks. It draws in three ways: called as
``renderer(record, directory)`` it writes a PNG under the run directory; ``figure(value)``
returns a matplotlib Figure (after the fact, in a notebook); ``frames(values)`` returns one
figure and a ``draw(index)`` that redraws it for each value with colour limits and axes fixed
over all of them, which ``layerscope.animate`` writes as a GIF or an MP4.

matplotlib and numpy are imported when something is drawn (``pip install 'layerscope[plot]'``);
the drawing itself is in ``_heatmap_frames``, ``_histogram_frames`` and ``_pca_frames``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from torch import Tensor

from layerscope._imports import require
from layerscope.tensors._frames import TensorFrames
from layerscope.tensors._records import Record

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Frames of an animation: 6.4 x 3.6 inches at 80 dpi, 512 x 288 pixels, as the other animations.
FRAME_SIZE = (6.4, 3.6)
FRAME_DPI = 80
# A PNG written by a callback: matplotlib's default 6.4 x 4.8 inches at this dpi.
PNG_DPI = 100


@dataclass(frozen=True, kw_only=True)
class _Renderer:
    """What every renderer does; subclasses say how one frame is drawn."""

    # The folder under ``<directory>/renders/`` that the callback form writes into.
    what: ClassVar[str] = ""

    def __call__(self, record: Record, directory: str | os.PathLike[str] | None) -> Path:
        """Draw ``record`` and write a PNG under ``directory``; the ``on_tensor`` callback form.

        The file is ``<directory>/renders/<what>/<module>-<kind>-<tensor>/``
        ``step-<step, 9 digits>-<phase>-<call>.png``, with characters other than letters,
        digits, ``.``, ``_`` and ``-`` in names replaced by ``_`` (the root module is
        ``root``). Written beside and renamed, so no reader sees half a file.

        Args:
            record: a ``layerscope.tensors.Record``.
            directory: where the run keeps results (``watch`` gives it to ``on_tensor``).

        Returns:
            The path written.

        Raises:
            ValueError: ``directory`` is None (a run in memory has no directory).
            TypeError: ``record`` is not a Record.
        """
        if not isinstance(record, Record):
            raise TypeError(
                f"record: expected a layerscope.tensors.Record, got {type(record).__name__}"
            )
        if directory is None:
            raise ValueError(
                f"directory: {type(self).__name__} as an on_tensor callback writes PNG files "
                f"into the run directory, and this run has none (it is in memory, or on an "
                f"object store): give watch a run= directory on this machine's disk, or draw "
                f"with {type(self).__name__}().figure(record)"
            )
        path = render_path(directory, self.what, record)
        fig = self.figure(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            fig.savefig(partial, format="png", dpi=PNG_DPI)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return path

    def figure(self, value: Tensor | Record) -> Figure:
        """A matplotlib Figure of one tensor; a Record's module, kind, tensor, step in its title.

        Made without pyplot: a notebook shows it as a cell's value, ``fig.savefig`` writes it.

        Raises:
            TypeError: ``value`` is neither a Tensor nor a Record, or is complex.
            ValueError: the tensor is empty, or (PCA) has fewer than 2 samples or features.
        """
        frames = self._frames([value], None, None)
        frames.draw(0)
        return frames.figure

    def frames(self, values: Sequence[Tensor | Record]) -> TensorFrames:
        """One figure for all of ``values``, and ``draw(index)`` to show each in turn.

        Colour limits and axes are fixed over all values, so frames compare. The frame is
        512 x 288 pixels and its layout fixed; ``layerscope.animate`` writes the frames.

        Raises:
            ValueError: ``values`` is empty, or a value cannot be drawn (see ``figure``).
        """
        values = list(values)
        if not values:
            raise ValueError("values: no tensors to draw")
        frames = self._frames(values, FRAME_SIZE, FRAME_DPI)
        frames.draw(len(values) - 1)
        # Lay out once and keep it: every frame has the same axes.
        frames.figure.draw_without_rendering()
        frames.figure.set_layout_engine("none")
        return frames

    def _frames(
        self,
        values: list[Tensor | Record],
        size: tuple[float, float] | None,
        dpi: float | None,
    ) -> TensorFrames:
        require("matplotlib", "plot")
        return self._draw(values, size, dpi)

    def _draw(
        self,
        values: list[Tensor | Record],
        size: tuple[float, float] | None,
        dpi: float | None,
    ) -> TensorFrames:
        """Build the frames of ``values``; each renderer draws its own kind."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class HeatMap(_Renderer):
    """A tensor as an image: a diverging colour map centred on 0, limits symmetric.

    What the image shows, by the tensor's dimensions:

    - 2-D as it is: a weight is (out, in), an activation (batch, features);
    - 1-D as one row, 0-D as one pixel;
    - 3-D (batch, seq, hidden): the first sample, (seq, hidden);
    - 4-D (N, C, H, W): the first sample's first ``max_channels`` channels in a grid, each an
      H x W tile, a row of rows (left to right, then down), one blank pixel between tiles;
    - more dimensions: the first sample, all its dimensions but the last as rows.

    An image larger than ``max_side`` pixels a side is shrunk by block means (blocks of
    ``ceil(side / max_side)`` elements in each direction, the last block of a side partial), so
    a frame stays cheap; the axes keep counting the tensor's own rows and columns. NaN shows
    grey, as the gaps between tiles do; a block holding a NaN is NaN; +-Inf take the ends
    of the colour scale; the title counts NaN and Inf. The colour limits are +-(largest finite
    magnitude in the image); over frames, in all of them.

    Args:
        max_side: the most pixels an image has on a side before block means shrink it.
        max_channels: the most channels of a 4-D tensor shown.
        cmap: a diverging matplotlib colour map.

    Examples:
        >>> import torch
        >>> from layerscope.tensors import HeatMap
        >>> fig = HeatMap().figure(torch.randn(8, 16))
        >>> image = fig.axes[0].images[0]
        >>> image.get_array().shape, image.norm.vmin == -image.norm.vmax
        ((8, 16), True)
    """

    max_side: int = 512
    max_channels: int = 64
    cmap: str = "RdBu_r"

    what: ClassVar[str] = "heatmap"

    def __post_init__(self) -> None:
        _check_positive("max_side", self.max_side)
        _check_positive("max_channels", self.max_channels)
        if not isinstance(self.cmap, str):
            raise TypeError(f"cmap: expected a colour map's name, got {type(self.cmap).__name__}")

    def _draw(
        self,
        values: list[Tensor | Record],
        size: tuple[float, float] | None,
        dpi: float | None,
    ) -> TensorFrames:
        from layerscope.tensors._heatmap_frames import heatmap_frames

        return heatmap_frames(
            values,
            size,
            dpi,
            max_side=self.max_side,
            max_channels=self.max_channels,
            cmap=self.cmap,
        )


@dataclass(frozen=True, kw_only=True)
class Histogram(_Renderer):
    """A histogram of a tensor's values, ``bins`` equal bins, the y axis counting elements.

    The bins go from the smallest finite value to the largest (over frames, of all). NaN and
    +-Inf are not in the bars; the title counts them. The callback form writes into
    ``renders/histogram/``; ``layerscope.animate`` calls this ``what="values"`` (its
    ``"histogram"`` is a run's recorded log2 histogram).

    Args:
        bins: how many bins.

    Examples:
        >>> import torch
        >>> from layerscope.tensors import Histogram
        >>> fig = Histogram(bins=10).figure(torch.tensor([0.0, 1.0, 1.0, float("nan")]))
        >>> bars = fig.axes[0].patches[0].get_data()
        >>> int(bars.values.sum()), len(bars.edges)
        (3, 11)
    """

    bins: int = 64

    what: ClassVar[str] = "histogram"

    def __post_init__(self) -> None:
        _check_positive("bins", self.bins)

    def _draw(
        self,
        values: list[Tensor | Record],
        size: tuple[float, float] | None,
        dpi: float | None,
    ) -> TensorFrames:
        from layerscope.tensors._histogram_frames import histogram_frames

        return histogram_frames(values, size, dpi, bins=self.bins)


@dataclass(frozen=True, kw_only=True)
class PCA(_Renderer):
    """Samples of a tensor projected on their top two principal components, a scatter plot.

    Samples, as (samples, features): 2-D as it is; 3-D (batch, seq, hidden) every position of
    every sample, (batch * seq, hidden); 4-D (N, C, H, W) and more each sample's channels,
    averaged over the spatial dimensions, (N, C). At most ``max_points`` samples, evenly
    spaced, are used; samples holding a NaN or Inf are left out (the title counts them).

    The components come from ``torch.pca_lowrank`` on the centred samples in float64 (exact
    where samples or features are at most 64, else a randomised approximation, seeded, that
    leaves the global random state alone). Each component's sign is chosen so that its
    largest loading (in magnitude) is positive. Over frames ONE projection is used, fit on the
    last frame's values (the last step shown): its mean and its two components, so points
    (and the cloud's centre) move from frame to frame instead of the axes flipping; the axis
    limits hold every frame's points. Axis labels give each component's share of the fit's
    variance.

    Args:
        max_points: the most samples used (and drawn).

    Raises:
        ValueError: (when drawing) fewer than 2 samples with finite values, or fewer than 2
            features, in the values the basis is fit on; feature counts that differ between
            frames.

    Examples:
        >>> import torch
        >>> from layerscope.tensors import PCA
        >>> fig = PCA().figure(torch.randn(100, 8))
        >>> fig.axes[0].collections[0].get_offsets().shape
        (100, 2)
    """

    max_points: int = 2048

    what: ClassVar[str] = "pca"

    def __post_init__(self) -> None:
        _check_positive("max_points", self.max_points)
        if self.max_points < 2:
            raise ValueError(f"max_points: expected at least 2, got {self.max_points!r}")

    def _draw(
        self,
        values: list[Tensor | Record],
        size: tuple[float, float] | None,
        dpi: float | None,
    ) -> TensorFrames:
        from layerscope.tensors._pca_frames import pca_frames

        return pca_frames(values, size, dpi, max_points=self.max_points)


def safe_name(name: str) -> str:
    """``name`` with characters other than letters, digits, ``.``, ``_``, ``-`` as ``_``.

    Examples:
        >>> safe_name("blocks.0/attn q"), safe_name("")
        ('blocks.0_attn_q', '')
    """
    return re.sub(r"[^\w.-]", "_", name)


def render_path(directory: str | os.PathLike[str], what: str, record: Record) -> Path:
    """Where the callback form of a renderer writes ``record``'s PNG.

    Examples:
        >>> import torch
        >>> record = Record(module="", type="Net", kind="activation", tensor="out", step=7,
        ...                 phase="train", call=0, value=torch.zeros(1))
        >>> render_path("run", "heatmap", record).as_posix()
        'run/renders/heatmap/root-activation-out/step-000000007-train-0.png'
    """
    folder = f"{safe_name(record.module) or 'root'}-{record.kind}-{safe_name(record.tensor)}"
    name = f"step-{record.step:09d}-{record.phase}-{record.call}.png"
    return Path(directory) / "renders" / what / folder / name


def _check_positive(argument: str, number: object) -> None:
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError(f"{argument}: expected an int, got {type(number).__name__}")
    if number < 1:
        raise ValueError(f"{argument}: expected a positive int, got {number!r}")
