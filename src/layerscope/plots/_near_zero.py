"""The fraction of each layer's values near zero, read off its log2 histograms.

miniai's dead chart counts the values in a histogram's lowest bins: a layer whose outputs
collapse towards zero without reaching it (a Conv2d's, unlike a ReLU's) shows there, while its
fraction of exact zeros stays 0. Here the lowest bins are the log2 slots below a magnitude.
Their edges are powers of two, so a threshold between two edges is rounded down to the lower
one: every value counted is below the threshold, and the figure says which edge it used.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from layerscope.plots._histograms import histogram_edges, read_histograms, widen
from layerscope.plots._select import Modules, layer_matrix
from layerscope.plots._value_axis import is_linear

if TYPE_CHECKING:
    from layerscope.plots._source import RunTables


def first_uncounted_slot(threshold: object, edges: np.ndarray) -> int:
    """The slot whose lower edge is ``threshold`` rounded down; the slots before it count.

    Raises:
        TypeError: ``threshold`` is not a number.
        ValueError: it is not finite, or below the lowest positive edge (nothing would count).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise TypeError(f"threshold: expected a magnitude such as 1e-3, got {threshold!r}")
    smallest = edges[1]  # slot 0 holds zeros and the magnitudes below this edge
    if not (math.isfinite(threshold) and threshold >= smallest):
        raise ValueError(
            f"threshold: expected a finite magnitude of at least {smallest:g} (the lowest "
            f"log2 slot edge), got {threshold!r}"
        )
    return int(np.searchsorted(edges, threshold, side="right")) - 1


def near_zero_fractions(
    run: RunTables, threshold: object, kind: str, modules: Modules, phase: str
) -> tuple[list[str], np.ndarray, np.ndarray, float]:
    """Layers, steps, the (layers, steps) fractions below the rounded threshold, and it.

    A fraction is of all the elements a histogram counted (NaN and Inf too, as
    ``zero_frac``'s); NaN where a layer has no row at a step or the row counted nothing.
    """
    try:
        edges = histogram_edges(run)
    except ValueError:
        edges = None
    if edges is None or is_linear(edges):
        raise ValueError(
            "threshold: counts values near zero from the run's log2 histograms, which it did "
            "not record (watch with histogram='log2' and the 'hist' statistic); "
            "threshold=None counts exact zeros"
        )
    first = first_uncounted_slot(threshold, edges)
    layers, frame = read_histograms(run, kind=kind, phase=phase, modules=modules, tensor=None)
    fractions = np.full(len(frame), np.nan)
    for row, (lo, hist) in enumerate(zip(frame["hist_lo"], frame["hist"], strict=True)):
        counts = widen(lo, hist, len(edges))
        total = counts.sum()
        if total:
            fractions[row] = counts[:first].sum() / total
    steps, values = layer_matrix(frame.assign(near_zero=fractions), layers, "near_zero")
    return layers, steps, values, float(edges[first])
