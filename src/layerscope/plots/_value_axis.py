"""Where a figure draws each slot of a run's histogram along its value axis.

A log2 histogram (``watch``'s default) is drawn over exponents: slot k from log2(edges[k]) to
one more, cropped to the slots that hold a count. Its zeros and Inf slots have no log2 place.

A linear one (``histogram=("linear", lo, hi, bins)``) is drawn in value units: its bins from
lo to hi, all of them, as the run chose that range. Its two open slots (values below lo,
values at or above hi) are counts without a width of their own: each is drawn as a band a
tenth of the range wide beyond its end, whose tick says what it holds ("< lo", "≥ hi").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from layerscope.plots._histograms import magnitude_slots, occupied_range

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# Width of an open slot's band, as a share of lo to hi.
OPEN_SLOT_SHARE = 0.1
# About this many ticks in value units between lo and hi.
VALUE_TICKS = 6


@dataclass(frozen=True, slots=True)
class ValueAxis:
    """Slot ``slots[i]`` of the histogram is drawn from ``bounds[i]`` to ``bounds[i + 1]``."""

    slots: np.ndarray
    bounds: np.ndarray
    label: str
    linear: bool

    @property
    def edge_label(self) -> str:
        """The label of an axis of bars or steps, each drawn from its slot's lower edge."""
        return self.label if self.linear else f"{self.label} (slot lower edge)"

    def open_slot_names(self) -> tuple[str, str]:
        """What a linear histogram's underflow and overflow slots hold, e.g. ``"< -1"``."""
        return f"< {self.bounds[1]:g}", f"≥ {self.bounds[-2]:g}"


def is_linear(edges: np.ndarray) -> bool:
    """Whether the run's histogram is linear: its first slot starts at -inf, a log2 one's at 0."""
    return bool(edges[0] == -np.inf)


def value_axis(edges: np.ndarray, counts: np.ndarray) -> ValueAxis:
    """The axis of a figure of ``counts`` (slots, columns) over the run's slot ``edges``."""
    if is_linear(edges):
        lo, hi = edges[1], edges[-1]
        band = (hi - lo) * OPEN_SLOT_SHARE
        bounds = np.concatenate([[lo - band], edges[1:], [hi + band]])
        return ValueAxis(np.arange(len(edges)), bounds, "value", linear=True)
    shown = occupied_range(counts, magnitude_slots(edges), edges)
    exponents = np.log2(edges[shown])
    return ValueAxis(shown, np.append(exponents, exponents[-1] + 1), "log2 |value|", linear=False)


def mark_value_axis(axes: Axes, axis: ValueAxis, which: str) -> None:
    """Limit ``axes``' ``which`` ("x" or "y") axis to the slots; name a linear one's open slots.

    A linear axis gets ticks in value units from lo to hi, a tick at the middle of each open
    slot's band saying what it holds, and a thin line where each band begins.
    """
    limits = (axis.bounds[0], axis.bounds[-1])
    if which == "x":
        axes.set_xlim(*limits)
    else:
        axes.set_ylim(*limits)
    if not axis.linear:
        return
    from matplotlib.ticker import MaxNLocator

    lo, hi = axis.bounds[1], axis.bounds[-2]
    inside = [tick for tick in MaxNLocator(VALUE_TICKS).tick_values(lo, hi) if lo <= tick <= hi]
    below, above = axis.open_slot_names()
    ticks = [(axis.bounds[0] + lo) / 2, *inside, (hi + axis.bounds[-1]) / 2]
    labels = [below, *(f"{tick + 0.0:g}" for tick in inside), above]  # + 0.0: no "-0"
    line = axes.axvline if which == "x" else axes.axhline
    for end in (lo, hi):
        line(end, color="0.5", linewidth=0.8)
    (axes.xaxis if which == "x" else axes.yaxis).set_ticks(ticks, labels)
