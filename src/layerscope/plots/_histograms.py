"""Log2 histograms: read trimmed from the store, widened, cropped to the magnitudes that occur.

Slot ``k`` counts magnitudes from ``edges[k]`` to ``edges[k + 1]``. The first slot (exact zeros,
edge 0) and the last (Inf, edge inf) have no log2 position: the figures show the finite
magnitude slots only, and the dead chart shows the zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from layerscope.plots._select import Modules, figure, read_rows
from layerscope.store._damage import check_fits

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

# How many steps the histogram figure overlays when none are chosen.
DEFAULT_STEP_COUNT = 4


def histogram_edges(run: RunTables) -> np.ndarray:
    """The lower edge of each slot, or a ValueError if the run kept no histograms."""
    edges = run.meta.get("histogram_edges")
    config = run.meta.get("config", {})
    if not edges or "hist" not in config.get("stats", ("hist",)):
        raise ValueError("the run has no histograms: record them with the 'hist' statistic")
    return np.asarray(edges, dtype=np.float64)


def magnitude_slots(edges: np.ndarray) -> np.ndarray:
    """Indices of the slots with a finite, positive lower edge (log2 magnitude slots)."""
    return np.flatnonzero((edges > 0) & np.isfinite(edges))


def read_histograms(
    run: RunTables, *, kind: str, phase: str, modules: Modules, tensor: str | None
) -> tuple[list[str], pandas.DataFrame]:
    """Selected layers with rows and their ``step, module, hist_lo, hist`` rows."""
    histogram_edges(run)
    return read_rows(
        run, ["hist_lo", "hist"], kind=kind, phase=phase, modules=modules, tensor=tensor
    )


def widen(lo: object, counts: object, slots: int) -> np.ndarray:
    """A trimmed histogram as all ``slots`` counts (float64); zeros where none was kept."""
    row = np.zeros(slots)
    if counts is None or lo is None or (isinstance(lo, float) and np.isnan(lo)):
        return row
    values = np.asarray(counts, dtype=np.float64)
    start = int(lo)  # type: ignore[call-overload]  # an int16 from the store
    check_fits(start, len(values), slots)
    row[start : start + len(values)] = values
    return row


def layer_counts(frame: pandas.DataFrame, layer: str, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, counts)`` of one layer: counts is (slots, steps), float64."""
    rows = frame[frame["module"] == layer]
    steps = rows["step"].to_numpy(dtype=np.int64)
    counts = np.stack(
        [widen(lo, hist, slots) for lo, hist in zip(rows["hist_lo"], rows["hist"], strict=True)],
        axis=1,
    )
    return steps, counts


def occupied_range(counts: np.ndarray, slots: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The magnitude slots from the first to the last one holding a count (rows of ``counts``).

    Where nothing is counted (all zeros, or NaN only), the slot of 1.0 alone.
    """
    held = slots[counts[slots].sum(axis=1) > 0]
    if len(held) == 0:
        one = int(np.searchsorted(edges, 1.0))
        return np.array([one])
    return np.arange(held.min(), held.max() + 1)


def default_steps(steps: np.ndarray) -> list[int]:
    """A few recorded steps spread over the run: first, last and evenly between."""
    picks = np.linspace(0, len(steps) - 1, min(DEFAULT_STEP_COUNT, len(steps)))
    return [int(steps[i]) for i in sorted(set(np.round(picks).astype(int)))]


def histogram_figure(
    run: RunTables,
    module: str,
    kind: str,
    tensor: str,
    steps: Sequence[int] | None,
    phase: str,
) -> Figure:
    """Distributions of one tensor at chosen steps, overlaid, over log2 magnitude slots."""
    if not isinstance(module, str):
        raise ValueError(f"module: expected one module name, got {module!r}")
    edges = histogram_edges(run)
    layers, frame = read_histograms(run, kind=kind, phase=phase, modules=[module], tensor=tensor)
    recorded, counts = layer_counts(frame, layers[0], len(edges))
    if steps is None:
        steps = default_steps(recorded)
    missing = [step for step in steps if step not in set(recorded.tolist())]
    if missing or not steps:
        raise ValueError(f"steps: {missing or steps} not recorded; recorded {recorded.tolist()}")
    slots = magnitude_slots(edges)
    chosen = [int(np.flatnonzero(recorded == step)[0]) for step in steps]
    shown = occupied_range(counts[:, chosen], slots, edges)
    exponents = np.log2(edges[shown])
    fig, (ax,) = figure(1, height=4.0)
    for step, column in zip(steps, chosen, strict=True):
        total = counts[:, column].sum()
        # Fractions of all elements (zeros and Infs included), so steps compare directly.
        fraction = counts[shown, column] / total if total else counts[shown, column]
        # The last slot's right edge is repeated so that its step has a width too.
        ax.plot(
            np.append(exponents, exponents[-1] + 1),
            np.append(fraction, fraction[-1]),
            drawstyle="steps-post",
            label=f"step {step}",
        )
    ax.set_xlabel("log2 |value| (slot lower edge)")
    ax.set_ylabel("fraction of elements")
    ax.set_title(f"{module or '(root)'} {kind} {tensor}")
    ax.legend(fontsize="small", loc="best")
    return fig
