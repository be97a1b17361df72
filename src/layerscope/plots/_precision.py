"""The fraction of each layer's values a low-precision format would lose, layers by steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from layerscope.plots._images import label_layers, label_steps, layers_figure
from layerscope.plots._select import Modules, layer_matrix, read_rows
from layerscope.stats import format_named

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

#: What ``which=`` draws: the values a format loses at either end, or at one.
LOSSES = ("lost", "overflow", "underflow")


def precision_heatmap(
    run: RunTables,
    fmt: str,
    kind: str,
    modules: Modules,
    phase: str,
    tensor: str | None,
    which: str,
) -> Figure:
    """Layers (rows, model order) by steps (columns) of the fraction of values ``fmt`` loses.

    A log colour scale over the fractions that are not zero; a cell where nothing is lost
    is light grey, one with no row blank.
    """
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    chosen = format_named(fmt)
    if which not in LOSSES:
        raise ValueError(f"which: expected one of {', '.join(map(repr, LOSSES))}, got {which!r}")
    recorded = run.meta.get("config", {}).get("stats", ())
    if chosen.over not in recorded:
        raise ValueError(
            f"fmt: the run holds no {chosen.label} counts: it was recorded with a stats= that "
            "left them out, or by a layerscope that did not count them"
        )
    columns = [chosen.over, chosen.under, "numel"]
    layers, frame = read_rows(run, columns, kind=kind, phase=phase, modules=modules, tensor=tensor)
    counts = {
        "overflow": frame[chosen.over].to_numpy(dtype=np.float64, na_value=np.nan),
        "underflow": frame[chosen.under].to_numpy(dtype=np.float64, na_value=np.nan),
    }
    lost = counts["overflow"] + counts["underflow"] if which == "lost" else counts[which]
    numel = frame["numel"].to_numpy(dtype=np.float64, na_value=np.nan)
    frame = frame.assign(fraction=np.where(numel > 0, lost / np.maximum(numel, 1.0), np.nan))
    steps, values = layer_matrix(frame, layers, "fraction")
    positive = values[np.isfinite(values) & (values > 0)]
    low = float(positive.min()) if len(positive) else 1e-6
    high = float(positive.max()) if len(positive) else 1.0
    cmap = colormaps["viridis"].with_extremes(under="lightgrey")
    # Zeros below the scale's lowest value: drawn in the "under" colour, apart from the rest.
    shown = np.ma.masked_invalid(np.where(values == 0, low / 2, values))
    fig, ax = layers_figure(layers)
    image = ax.imshow(
        shown,
        aspect="auto",
        interpolation="nearest",
        norm=LogNorm(vmin=low, vmax=max(high, low * 1.000001)),
        cmap=cmap,
    )
    label_layers(ax, layers)
    label_steps(ax, steps)
    what = {
        "lost": "overflow + flush to zero",
        "overflow": "overflow",
        "underflow": "flush to zero",
    }
    ax.set_title(f"{kind}: fraction lost in {chosen.label} ({what[which]})")
    fig.colorbar(image, ax=ax, label="fraction of values (grey: none)", extend="min")
    return fig
