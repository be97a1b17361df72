"""Animations of one tensor over steps: a frame per recorded step, written as GIF or MP4.

Frames are drawn with matplotlib and written by ``_video``. A GIF is kept in memory until
written (about 150 KB a frame), so one of thousands of steps wants ``steps=`` to choose some.
``"histogram"`` draws a run's recorded histograms (log2 or linear); ``"heatmap"``, ``"pca"`` and
``"values"`` draw whole tensors (a capture's, or those a run kept) with the renderers of
``layerscope.tensors``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.plots._histograms import histogram_edges, layer_counts, read_histograms
from layerscope.plots._labels import drawn_name
from layerscope.plots._select import DEFAULT_TENSOR, check_kind, check_phase
from layerscope.plots._value_axis import ValueAxis, mark_value_axis, value_axis
from layerscope.plots._video import FORMATS, write_video

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables
    from layerscope.tensors import Record, TensorFrames

# Of whole tensors, each by a renderer of layerscope.tensors: HeatMap, PCA, Histogram.
__all__ = [
    "FORMATS",
    "WHATS",
    "default_path",
    "histogram_animation",
    "tensor_animation",
    "tensor_records",
]

TENSOR_WHATS = ("heatmap", "pca", "values")
WHATS = ("histogram", *TENSOR_WHATS)
FRAME_SIZE = (6.4, 3.6)  # inches, at 80 dpi: 512 x 288 pixels
DPI = 80


def default_path(run_path: str | None, module: str, kind: str, what: str) -> Path:
    """``<run>/animations/<module>-<kind>-<what>.gif``; a ValueError for a run in memory."""
    if run_path is None:
        raise ValueError("path: the run is in memory, so there is no run directory: give path=")
    name = re.sub(r"[^\w.-]", "_", module) or "root"
    return Path(run_path) / "animations" / f"{name}-{kind}-{what}.gif"


def histogram_animation(
    run: RunTables,
    module: str,
    kind: str,
    tensor: str | None,
    phase: str,
    steps: Sequence[int] | None,
    path: Path,
    fps: float,
) -> Path:
    """Write the histogram of one tensor, a frame per step, to ``path``; return it."""
    edges = histogram_edges(run)
    layers, frame = read_histograms(run, kind=kind, phase=phase, modules=[module], tensor=tensor)
    recorded, counts = layer_counts(frame, layers[0], len(edges))
    columns = _chosen_columns(recorded, steps)
    counts = counts[:, columns]
    totals = counts.sum(axis=0)
    fractions = counts / np.where(totals > 0, totals, 1)
    axis = value_axis(edges, counts)
    title = f"{drawn_name(module or '(root)')} {kind} {drawn_name(tensor or DEFAULT_TENSOR[kind])}"
    fig, bars, caption = _histogram_frame(axis, fractions[axis.slots].max(initial=0.0), title)

    def draw(index: int) -> None:
        for bar, height in zip(bars, fractions[axis.slots, index], strict=True):
            bar.set_height(height)
        step = int(recorded[columns[index]])
        caption.set_text(f"step {step}\n{_outside(axis, fractions[:, index])}")

    _save(fig, draw, len(columns), path, fps)
    return path


def _outside(axis: ValueAxis, fractions: np.ndarray) -> str:
    """The caption's second line: the fractions outside the values of the axis.

    A log2 histogram's zeros have no bar. A linear one's open slots have bars, but no values
    on the axis: their fractions are written out too.
    """
    if not axis.linear:
        return f"zeros {fractions[0]:.1%}"
    below, above = axis.open_slot_names()
    return f"{below}: {fractions[0]:.1%}  {above}: {fractions[-1]:.1%}"


def tensor_animation(frames: TensorFrames, path: Path, fps: float) -> Path:
    """Write ``frames``, blitted, to ``path``; return it."""
    write_video(_blitted(frames.figure, frames.draw, len(frames), frames.moving), path, fps)
    return path


def tensor_records(
    records: Iterable[Record],
    module: str,
    kind: str,
    tensor: str | None,
    phase: str,
    steps: Sequence[int] | None,
) -> list[Record]:
    """The records of one tensor, the first call of each step, by step or in ``steps``' order.

    ``tensor`` None: the kind's usual one (``out``, ``weight``, ...), or the only one kept.

    Raises:
        ValueError: naming ``module``, ``kind``, ``tensor``, ``phase`` or ``steps``, whichever
            has no records.
    """
    kind = check_kind(kind)
    phase = check_phase(phase)
    records = list(records)
    of_module = [record for record in records if record.module == module]
    if not of_module:
        kept = list(dict.fromkeys(record.module for record in records))
        raise ValueError(f"module: no whole tensors of {module!r}; kept of modules {kept}")
    of_kind = [record for record in of_module if record.kind == kind]
    if not of_kind:
        kinds = sorted({record.kind for record in of_module})
        raise ValueError(f"kind: no {kind!r} tensors of module {module!r}; kept {kinds}")
    names = list(dict.fromkeys(record.tensor for record in of_kind))
    if tensor is None:
        usual = DEFAULT_TENSOR[kind]
        if usual not in names and len(names) > 1:
            raise ValueError(
                f"tensor: module {module!r} kept {kind} tensors {names}; choose one with tensor="
            )
        tensor = usual if usual in names else names[0]
    elif tensor not in names:
        raise ValueError(f"tensor: module {module!r} kept {kind} tensors {names}, not {tensor!r}")
    of_tensor = [record for record in of_kind if record.tensor == tensor]
    first_calls: dict[int, Record] = {}
    for record in of_tensor:
        if record.phase != phase:
            continue
        held = first_calls.get(record.step)
        if held is None or record.call < held.call:
            first_calls[record.step] = record
    if not first_calls:
        phases = sorted({record.phase for record in of_tensor})
        raise ValueError(
            f"phase: no {phase!r} records of {module!r} {kind} {tensor!r}; kept phases {phases}"
        )
    kept_steps = sorted(first_calls)
    if steps is None:
        return [first_calls[step] for step in kept_steps]
    missing = [step for step in steps if int(step) not in first_calls]
    if missing or not len(steps):
        shown = kept_steps if len(kept_steps) <= 20 else [*kept_steps[:10], "...", *kept_steps[-5:]]
        raise ValueError(
            f"steps: {missing or list(steps)} not kept; {len(kept_steps)} steps were: {shown}"
        )
    return [first_calls[int(step)] for step in steps]


def _chosen_columns(recorded: np.ndarray, steps: Sequence[int] | None) -> list[int]:
    """Columns of ``recorded`` for ``steps`` (all if None), or a ValueError naming ``steps``."""
    if steps is None:
        return list(range(len(recorded)))
    where = {int(step): index for index, step in enumerate(recorded)}
    missing = [step for step in steps if int(step) not in where]
    if missing or not len(steps):
        raise ValueError(
            f"steps: {missing or list(steps)} not recorded; the run recorded {len(recorded)} "
            f"steps from {recorded.min()} to {recorded.max()}"
        )
    return [where[int(step)] for step in steps]


def _histogram_frame(axis: ValueAxis, top: float, title: str) -> tuple[Figure, Any, Any]:
    """The figure every frame redraws: empty bars over the slots shown, fixed axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FRAME_SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    lefts, widths = axis.bounds[:-1], np.diff(axis.bounds)
    bars = ax.bar(lefts, np.zeros(len(lefts)), width=widths, align="edge", color="C0",
                  edgecolor="white", linewidth=0.5)  # fmt: skip
    if axis.linear:
        # The open slots count everything beyond lo or hi: not bins, so hatched.
        for bar in (bars[0], bars[-1]):
            bar.set_hatch("//")
    mark_value_axis(ax, axis, "x")
    ax.set_ylim(0, top * 1.05 if top > 0 else 1.0)
    ax.set_xlabel(axis.edge_label)
    ax.set_ylabel("fraction of elements")
    ax.set_title(title)
    caption = ax.text(0.98, 0.95, "", transform=ax.transAxes, ha="right", va="top")
    # Lay out once and keep it: every frame has the same axes.
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    return fig, bars, caption


def _save(fig: Figure, draw: Any, frames: int, path: Path, fps: float) -> None:
    """Draw ``frames`` frames with ``draw(index)`` and write them to ``path``."""
    write_video(_blitted(fig, draw, frames), path, fps)


def _blitted(
    fig: Figure, draw: Any, frames: int, moving: Sequence[Artist] | None = None
) -> Iterator[np.ndarray]:
    """Each frame as an RGBA array, redrawing only what moves over a background drawn once.

    What moves is ``moving``, by default each axes' bars and texts; the spines are drawn again
    over them, as a full draw does. Laying out and drawing the ticks and labels anew per frame
    would cost ten times more.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    if moving is None:
        moving = [artist for ax in fig.axes for artist in (*ax.patches, *ax.texts)]
    over = [spine for ax in fig.axes for spine in ax.spines.values()]
    for artist in moving:
        artist.set_visible(False)
    canvas.draw()  # type: ignore[no-untyped-call]
    background = canvas.copy_from_bbox(fig.bbox)  # type: ignore[no-untyped-call]
    for artist in moving:
        artist.set_visible(True)
    for index in range(frames):
        draw(index)
        canvas.restore_region(background)  # type: ignore[no-untyped-call]
        for artist in (*moving, *over):
            fig.draw_artist(artist)
        yield np.array(canvas.buffer_rgba())  # type: ignore[no-untyped-call]
