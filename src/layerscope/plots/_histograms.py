"""Histograms: read trimmed from the store, widened to all slots, cropped to the ones that occur.

Slot ``k`` counts from ``edges[k]`` to ``edges[k + 1]``: magnitudes of a log2 histogram, values
of a linear one. A log2 histogram's first slot (exact zeros, edge 0) and last (Inf, edge inf)
have no log2 position: the figures show the finite magnitude slots, and the dead chart the
zeros. Where each slot is drawn is ``_value_axis``'s.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from layerscope.plots._select import Modules, read_rows
from layerscope.stats import check_fits

if TYPE_CHECKING:
    import pandas

    from layerscope.plots._source import RunTables


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


def occupied_range(counts: np.ndarray, slots: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The magnitude slots from the first to the last one holding a count (rows of ``counts``).

    Where nothing is counted (all zeros, or NaN only), the slot of 1.0 alone.
    """
    held = slots[counts[slots].sum(axis=1) > 0]
    if len(held) == 0:
        one = int(np.searchsorted(edges, 1.0))
        return np.array([one])
    return np.arange(held.min(), held.max() + 1)


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
    # None, NaN or pandas' NA (a row of a file without histograms): nothing kept
    if not isinstance(counts, Collection) or not isinstance(lo, numbers.Number) or lo != lo:
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
