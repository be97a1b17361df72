"""One tensor's histogram at chosen steps, a line per step, as fractions of its elements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from layerscope.plots._histograms import histogram_edges, layer_counts, read_histograms
from layerscope.plots._labels import drawn_name
from layerscope.plots._select import figure
from layerscope.plots._value_axis import mark_value_axis, value_axis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

# How many steps the histogram figure overlays when none are chosen.
DEFAULT_STEP_COUNT = 4


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
    """Distributions of one tensor at chosen steps, overlaid, as fractions of its elements."""
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
    chosen = [int(np.flatnonzero(recorded == step)[0]) for step in steps]
    axis = value_axis(edges, counts[:, chosen])
    fig, (ax,) = figure(1, height=4.0)
    for step, column in zip(steps, chosen, strict=True):
        total = counts[:, column].sum()
        # Fractions of all elements (zeros and Infs included), so steps compare directly.
        fraction = counts[axis.slots, column] / total if total else counts[axis.slots, column]
        # The last slot's right edge closes its step, at the same height.
        ax.plot(
            axis.bounds,
            np.append(fraction, fraction[-1]),
            drawstyle="steps-post",
            label=f"step {step}",
        )
    mark_value_axis(ax, axis, "x")
    ax.set_xlabel(axis.edge_label)
    ax.set_ylabel("fraction of elements")
    ax.set_title(f"{drawn_name(module or '(root)')} {kind} {drawn_name(tensor)}")
    ax.legend(fontsize="small", loc="best")
    return fig
