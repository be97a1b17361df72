"""Animations of one tensor over steps: a frame per recorded step, written as GIF or MP4.

Frames are drawn with matplotlib and written by ``_video``. A GIF is kept in memory until
written (about 150 KB a frame), so one of thousands of steps wants ``steps=`` to choose some.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.plots._histograms import (
    histogram_edges,
    layer_counts,
    magnitude_slots,
    occupied_range,
    read_histograms,
)
from layerscope.plots._select import DEFAULT_TENSOR
from layerscope.plots._video import write_video

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

WHATS = ("histogram",)
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
    """Write the log2 histogram of one tensor, a frame per step, to ``path``; return it."""
    edges = histogram_edges(run)
    layers, frame = read_histograms(run, kind=kind, phase=phase, modules=[module], tensor=tensor)
    recorded, counts = layer_counts(frame, layers[0], len(edges))
    columns = _chosen_columns(recorded, steps)
    counts = counts[:, columns]
    totals = counts.sum(axis=0)
    fractions = counts / np.where(totals > 0, totals, 1)
    shown = occupied_range(counts, magnitude_slots(edges), edges)
    exponents = np.log2(edges[shown])
    title = f"{module or '(root)'} {kind} {tensor or DEFAULT_TENSOR[kind]}"
    fig, bars, caption = _histogram_frame(exponents, fractions[shown].max(initial=0.0), title)

    def draw(index: int) -> None:
        for bar, height in zip(bars, fractions[shown, index], strict=True):
            bar.set_height(height)
        step = int(recorded[columns[index]])
        caption.set_text(f"step {step}\nzeros {fractions[0, index]:.1%}")

    _save(fig, draw, len(columns), path, fps)
    return path


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


def _histogram_frame(exponents: np.ndarray, top: float, title: str) -> tuple[Figure, Any, Any]:
    """The figure every frame redraws: empty bars over the slots shown, fixed axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FRAME_SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar(exponents, np.zeros(len(exponents)), width=1.0, align="edge", color="C0",
                  edgecolor="white", linewidth=0.5)  # fmt: skip
    ax.set_xlim(exponents[0], exponents[-1] + 1)
    ax.set_ylim(0, top * 1.05 if top > 0 else 1.0)
    ax.set_xlabel("log2 |value| (slot lower edge)")
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


def _blitted(fig: Figure, draw: Any, frames: int) -> Iterator[np.ndarray]:
    """Each frame as an RGBA array, redrawing only what moves over a background drawn once.

    What moves is each axes' bars and texts; the spines are drawn again over them, as a full
    draw does. Laying out and drawing the ticks and labels anew per frame would cost ten
    times more.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
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
