"""Image figures: layers by steps heatmaps, and histograms over steps ("colorful dimension").

Columns are recorded steps, one pixel wide each whatever the gaps between them (a schedule
records densely, then sparsely), with tick labels that say the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.plots._histograms import histogram_edges, layer_counts, read_histograms
from layerscope.plots._labels import drawn_name
from layerscope.plots._select import (
    Modules,
    check_stat,
    figure,
    layer_matrix,
    layers_with_rows,
    read_rows,
)
from layerscope.plots._value_axis import ValueAxis, mark_value_axis, value_axis

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

# Statistics that are magnitudes spanning decades: shown on a log colour scale.
LOG_SCALE_STATS = frozenset(("absmax", "l2", "std", "numel", "nan_count", "inf_count"))
# color_dim of every layer: at most this many panels, in rows of PANEL_COLUMNS past that many.
MAX_PANELS = 16
PANEL_COLUMNS = 4
# A heat map names every row up to this many layers, and some of them past it.
MAX_ROW_LABELS = 40
# A heat map's width: its image and colour bar, and room for the row labels at about the
# width of the widest lowercase letter a character (inches, at the default font size).
IMAGE_WIDTH, LABEL_CHARACTER_WIDTH = 5.0, 0.13


def label_steps(axes: Axes, steps: np.ndarray) -> None:
    """Tick labels of an image's columns (0, 1, ...) as the steps they are."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def step_at(position: float, _: Any) -> str:
        column = round(position)
        return str(steps[column]) if 0 <= column < len(steps) else ""

    axes.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
    axes.xaxis.set_major_formatter(FuncFormatter(step_at))
    axes.set_xlabel("step")


def label_layers(axes: Axes, layers: list[str]) -> None:
    """Tick labels of an image's rows: every layer's name, or ``MAX_ROW_LABELS`` spread."""
    names = [drawn_name(name or "(root)") for name in layers]
    rows = np.arange(len(layers))
    if len(layers) > MAX_ROW_LABELS:
        rows = np.unique(np.round(np.linspace(0, len(layers) - 1, MAX_ROW_LABELS)).astype(int))
    axes.set_yticks(rows, [names[row] for row in rows])
    axes.set_ylabel("module")


def layers_figure(layers: list[str]) -> tuple[Figure, Axes]:
    """A figure of one image of ``layers`` rows, its height growing with them.

    Its width grows with the longest row label, so that the image keeps its room.
    """
    height = min(max(3.0, 0.3 * len(layers) + 1.5), 14.0)
    longest = max((len(drawn_name(name or "(root)")) for name in layers), default=0)
    width = max(8.0, IMAGE_WIDTH + LABEL_CHARACTER_WIDTH * longest)
    fig, (ax,) = figure(1, width=width, height=height, sharex=False)
    return fig, ax


def colour_scale(stat: str, values: np.ndarray) -> Any:
    """LogNorm over the positive values of a magnitude statistic, else a linear Normalize."""
    from matplotlib.colors import LogNorm, Normalize

    if stat in LOG_SCALE_STATS:
        positive = values[np.isfinite(values) & (values > 0)]
        if len(positive):
            return LogNorm(vmin=positive.min(), vmax=positive.max())
    finite = values[np.isfinite(values)]
    if not len(finite):
        return Normalize(0.0, 1.0)  # nothing to scale: an all-NaN image still draws
    return Normalize(finite.min(), finite.max())


def heatmap(
    run: RunTables, stat: str, kind: str, modules: Modules, phase: str, tensor: str | None
) -> Figure:
    """Layers (rows, model order) by steps (columns) of one statistic."""
    check_stat(run, stat)
    layers, frame = read_rows(run, [stat], kind=kind, phase=phase, modules=modules, tensor=tensor)
    steps, values = layer_matrix(frame, layers, stat)
    fig, ax = layers_figure(layers)
    # Non-positive values have no place on a log scale: masked, they show as blank.
    norm = colour_scale(stat, values)
    shown = np.ma.masked_invalid(values)
    if stat in LOG_SCALE_STATS:
        shown = np.ma.masked_less_equal(shown, 0)
    image = ax.imshow(shown, aspect="auto", interpolation="nearest", norm=norm, cmap="viridis")
    label_layers(ax, layers)
    label_steps(ax, steps)
    ax.set_title(f"{kind} {stat}")
    fig.colorbar(image, ax=ax, label=stat)
    return fig


def color_dim(
    run: RunTables, kind: str, modules: Modules, phase: str, tensor: str | None
) -> Figure:
    """Per layer, its histogram over steps as an image (colour: log(1 + count)).

    Rows are the slots where ``_value_axis`` puts them: log2 magnitudes that occur, or a
    linear histogram's values from lo to hi with its open slots beyond. With
    ``modules=None`` and more than ``MAX_PANELS`` layers, that many spread evenly from the
    first layer to the last; the figure's title says so.
    """
    edges = histogram_edges(run)
    total = None
    if modules is None:
        present = layers_with_rows(run, kind=kind, phase=phase, tensor=tensor)
        if len(present) > MAX_PANELS:
            total = len(present)
            picks = np.round(np.linspace(0, len(present) - 1, MAX_PANELS)).astype(int)
            modules = [present[index] for index in picks]
    layers, frame = read_histograms(run, kind=kind, phase=phase, modules=modules, tensor=tensor)
    fig, axes = panels(len(layers))
    for ax, layer in zip(axes, layers, strict=True):
        steps, counts = layer_counts(frame, layer, len(edges))
        axis = value_axis(edges, counts)
        draw_slots(ax, axis, np.log1p(counts[axis.slots]))
        ax.set_ylabel(axis.label)
        ax.set_title(f"{drawn_name(layer or '(root)')} {kind}", fontsize="medium")
        label_steps(ax, steps)
    if total is not None:
        fig.suptitle(f"{len(layers)} of {total} layers, spread evenly; modules= chooses others")
    return fig


def draw_slots(axes: Axes, axis: ValueAxis, image: np.ndarray) -> None:
    """``image`` (slots, steps) with each slot's row where ``axis`` puts it."""
    columns = image.shape[1]
    if axis.linear:
        # The open slots' bands are wider than a bin: rows of unequal height.
        edges = np.arange(columns + 1) - 0.5
        axes.pcolormesh(edges, axis.bounds, image, cmap="viridis", shading="flat")
    else:
        # Each log2 slot spans one power of two: equal rows.
        extent = (-0.5, columns - 0.5, axis.bounds[0], axis.bounds[-1])
        axes.imshow(
            image,
            aspect="auto",
            interpolation="nearest",
            origin="lower",
            extent=extent,
            cmap="viridis",
        )
    mark_value_axis(axes, axis, "y")


def panels(count: int) -> tuple[Figure, list[Axes]]:
    """``count`` axes, one column up to ``PANEL_COLUMNS``, then ``PANEL_COLUMNS`` a row."""
    from matplotlib.figure import Figure

    columns = 1 if count <= PANEL_COLUMNS else PANEL_COLUMNS
    rows = -(-count // columns)
    width = 8.0 if columns == 1 else 12.0
    fig = Figure(figsize=(width, max(2.5, 2.0 * rows)), layout="constrained")
    grid = fig.subplots(rows, columns, squeeze=False)
    for extra in grid.flat[count:]:
        extra.remove()
    return fig, list(grid.flat[:count])
