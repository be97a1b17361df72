"""Frames of whole tensors: heat map images, histograms of values, PCA scatters.

First the kernels, numpy in float64 on one tensor each and no matplotlib; then, for each
renderer of ``layerscope.tensors``, a builder of ``TensorFrames``: one figure whose limits
hold every value, and a ``draw(index)`` that changes only the artists that move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from layerscope.tensors._records import Record
from layerscope.tensors._render import TensorFrames

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from layerscope.tensors._render import PCA, HeatMap, Histogram

# Kinds whose 2-D tensors are (out, in) matrices rather than (samples, features).
WEIGHT_KINDS = frozenset(("weight", "weight_grad", "update"))
# The "bad" colour of a heat map: NaN, and the gaps between the tiles of a 4-D tensor.
NAN_COLOUR = "0.55"
# torch.pca_lowrank is exact when its rank q is min(samples, features); up to this many it is
# cheap, past it a randomised rank-PCA_RANK fit with PCA_ITERATIONS power iterations.
PCA_EXACT = 64
PCA_RANK = 12
PCA_ITERATIONS = 4
# Room around the points of a scatter, as a share of their range.
MARGIN = 0.05


# ---------------------------------------------------------------- values


def tensor_of(value: Tensor | Record) -> Tensor:
    """The tensor of a Record or a Tensor, checked to be drawable."""
    if isinstance(value, Record):
        tensor = value.value
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


# ---------------------------------------------------------------- heat map


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
    renderer: HeatMap,
    values: list[Tensor | Record],
    size: tuple[float, float] | None,
    dpi: float | None,
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
            made[index] = heatmap_image(tensors[index], renderer.max_side, renderer.max_channels)
        return made[index]

    limit, rows, columns = 0.0, 1, 1
    for index in range(len(tensors)):
        shown = image_of(index)
        limit = max(limit, symmetric_limit(shown.image))
        rows, columns = max(rows, shown.rows), max(columns, shown.columns)
    limit = limit if limit > 0 else 1.0

    fig, ax = new_axes(size, dpi)
    cmap = colormaps[renderer.cmap].with_extremes(bad=NAN_COLOUR)
    image = ax.imshow(
        np.zeros((1, 1)),
        cmap=cmap,
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
    xlabel, ylabel = heatmap_labels(tensors[0], kind, renderer.max_channels)
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


# ---------------------------------------------------------------- histogram of values


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
    renderer: Histogram,
    values: list[Tensor | Record],
    size: tuple[float, float] | None,
    dpi: float | None,
) -> TensorFrames:
    """Histograms of ``values``, the same bins and y limit for all."""
    tensors = [tensor_of(value) for value in values]
    edges = value_edges(tensors, renderer.bins)
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


# ---------------------------------------------------------------- PCA


@dataclass(frozen=True, slots=True)
class Projection:
    """A fit PCA: the mean it centres on and its top two components.

    Attributes:
        mean: (features,) the fit samples' mean.
        components: (features, 2), orthonormal columns, each with its largest loading
            positive.
        explained: (2,) each component's share of the fit samples' variance.
    """

    mean: np.ndarray
    components: np.ndarray
    explained: np.ndarray

    def project(self, samples: np.ndarray) -> np.ndarray:
        """(samples, features) to (samples, 2)."""
        projected: np.ndarray = (samples - self.mean) @ self.components
        return projected


def pca_samples(tensor: Tensor, max_points: int) -> tuple[np.ndarray, int]:
    """``tensor`` as (samples, features) float64 (see ``PCA``); how many samples were left out.

    At most ``max_points`` samples, evenly spaced; those holding a NaN or Inf are left out.
    """
    dims = tensor.dim()
    if dims <= 1:
        matrix = tensor.reshape(1, -1)
    elif dims == 2:
        matrix = tensor
    elif dims == 3:  # (batch, seq, hidden): every position a sample
        matrix = tensor.reshape(-1, tensor.shape[-1])
    else:  # (N, C, H, W, ...): channels averaged over the spatial dimensions
        matrix = tensor.to(torch.float64).mean(dim=tuple(range(2, dims)))
    count = matrix.shape[0]
    if count > max_points:
        rows = np.round(np.linspace(0, count - 1, max_points)).astype(np.int64)
        matrix = matrix[torch.from_numpy(rows).to(matrix.device)]
    samples = to_float64(matrix)
    finite = np.isfinite(samples).all(axis=1)
    return samples[finite], int((~finite).sum())


def fit_pca(samples: np.ndarray) -> Projection:
    """The top two principal components of (samples, features), by ``torch.pca_lowrank``.

    Raises:
        ValueError: fewer than 2 samples or 2 features.
    """
    count, features = samples.shape
    if count < 2 or features < 2:
        raise ValueError(
            f"value: PCA needs at least 2 samples with finite values and 2 features, as "
            f"(samples, features); got {count} x {features}"
        )
    rank = min(count, features)
    # pca_lowrank draws random numbers: seeded, and the caller's random state left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        _, singular, basis = torch.pca_lowrank(
            torch.from_numpy(samples),
            q=rank if rank <= PCA_EXACT else PCA_RANK,
            center=True,
            niter=PCA_ITERATIONS,
        )
    components = basis[:, :2].numpy().copy()
    largest = np.abs(components).argmax(axis=0)
    signs = np.sign(components[largest, [0, 1]])
    components *= np.where(signs == 0, 1.0, signs)
    mean = samples.mean(axis=0)
    total = float(((samples - mean) ** 2).sum())
    explained = singular[:2].numpy() ** 2 / total if total > 0 else np.zeros(2)
    return Projection(mean=mean, components=components, explained=explained)


def pca_frames(
    renderer: PCA,
    values: list[Tensor | Record],
    size: tuple[float, float] | None,
    dpi: float | None,
) -> TensorFrames:
    """Scatters of ``values`` on one projection, fit on the last of them; fixed limits."""
    tensors = [tensor_of(value) for value in values]
    fit_samples, _ = pca_samples(tensors[-1], renderer.max_points)
    projection = fit_pca(fit_samples)
    features = fit_samples.shape[1]
    points, left_out = [], []
    for index, tensor in enumerate(tensors):
        samples, dropped = pca_samples(tensor, renderer.max_points)
        if samples.shape[1] != features:
            raise ValueError(
                f"value: frame {index} has {samples.shape[1]} features and the last frame, "
                f"which the PCA is fit on, {features}; one projection needs one feature count"
            )
        points.append(projection.project(samples))
        left_out.append(dropped)
    every = np.concatenate(points)
    lows = every.min(axis=0) if every.size else np.zeros(2)
    highs = every.max(axis=0) if every.size else np.zeros(2)

    fig, ax = new_axes(size, dpi)
    scatter = ax.scatter(points[0][:, 0], points[0][:, 1], s=9, color="C0", linewidths=0)
    ax.set_xlim(*padded_range(float(lows[0]), float(highs[0])))
    ax.set_ylim(*padded_range(float(lows[1]), float(highs[1])))
    last = values[-1]
    fit = f" at step {last.step}" if isinstance(last, Record) and len(values) > 1 else ""
    ax.set_xlabel(f"PC1 ({projection.explained[0]:.0%} of variance{fit})")
    ax.set_ylabel(f"PC2 ({projection.explained[1]:.0%})")
    titles = Titles(fig, ax, values, tensors)

    def draw(index: int) -> None:
        scatter.set_offsets(points[index])
        dropped = left_out[index]
        note = f"{dropped} samples with NaN/Inf left out" if dropped else ""
        titles.show(index, f"{len(points[index])} samples", note)

    moving: list[Artist] = [scatter, titles.caption]
    return TensorFrames(figure=fig, moving=moving, draw=draw, count=len(values))
