"""Attention heads by steps: each head's entropy (or largest probability) over recorded steps.

It reads the ``attention`` table (``watch(attention=True)``): one row per head of each
attention call. A head whose attention collapses onto one key, its entropy near zero, is the
cell to find among dozens, so the colour scale runs from red (collapsed) through yellow to
blue (spread evenly), over the value's whole range (0 to 1 for a fraction or a probability).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from layerscope.model import quote_identifier
from layerscope.plots._images import label_steps, panels
from layerscope.plots._labels import drawn_name
from layerscope.plots._select import PICKED_MODULES, check_phase

if TYPE_CHECKING:
    import pandas
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables


@dataclass(frozen=True, slots=True)
class Measure:
    """How one column of the table is drawn: what it says, and which end is a collapse."""

    title: str  # the figure's title
    label: str  # the colour bar's
    nats: bool  # in nats, from 0 to log(keys); else a fraction from 0 to 1
    high_collapses: bool  # a collapsed head is near the top (a probability), not the bottom


#: The columns ``value=`` may draw.
MEASURES = {
    "entropy_frac": Measure(
        "attention entropy / log(allowed keys): 1 spread evenly, 0 all on one key",
        "entropy fraction",
        nats=False,
        high_collapses=False,
    ),
    "entropy_mean": Measure(
        "attention entropy, mean over queries: 0 all on one key",
        "entropy (nats)",
        nats=True,
        high_collapses=False,
    ),
    "entropy_min": Measure(
        "attention entropy of the sharpest query: 0 all on one key",
        "lowest entropy (nats)",
        nats=True,
        high_collapses=False,
    ),
    "max_prob": Measure(
        "attention's largest probability, mean over queries: 1 all on one key",
        "largest probability",
        nats=False,
        high_collapses=True,
    ),
}
# Red where a head collapses, blue where it spreads evenly; a cell without a row is grey.
COLLAPSE_COLORMAP = "RdYlBu"
NO_ROW_COLOUR = "lightgrey"

AttentionModules = str | Sequence[str] | None


def attention_heatmap(run: RunTables, modules: AttentionModules, value: str, phase: str) -> Figure:
    """One panel per attention module: heads (rows) by recorded steps (columns) of ``value``.

    Columns are the steps any drawn module recorded, the same in every panel; rows are the
    module's heads, by call where the module made more than one attention call a pass.
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    measure = MEASURES.get(value)
    if measure is None:
        raise ValueError(f"value: expected one of {list(MEASURES)}, got {value!r}")
    names = attention_modules(run, modules, check_phase(phase))
    frame = read_heads(run, names, value, phase)
    steps = np.unique(frame["step"].to_numpy(dtype=np.int64))
    high = math.log(max(2, int(frame["keys"].max()))) if measure.nats else 1.0
    cmap = colormaps[COLLAPSE_COLORMAP + ("_r" if measure.high_collapses else "")]
    norm = Normalize(0.0, high)
    types = {info.name: info.type for info in run.modules}
    fig, axes = panels(len(names))
    images = []
    for ax, name in zip(axes, names, strict=True):
        rows, values = head_matrix(frame[frame["module"] == name], steps)
        shown = np.ma.masked_invalid(values)
        image = ax.imshow(
            shown,
            aspect="auto",
            interpolation="nearest",
            norm=norm,
            cmap=cmap.with_extremes(bad=NO_ROW_COLOUR),
        )
        images.append(image)
        _label_heads(ax, rows)
        label_steps(ax, steps)
        kind = f" ({drawn_name(types[name])})" if name in types else ""
        ax.set_title(f"{drawn_name(name or '(root)')}{kind}", fontsize="medium")
    fig.suptitle(f"{measure.title} ({phase})")
    fig.colorbar(images[0], ax=axes, label=measure.label)
    return fig


def attention_modules(run: RunTables, modules: AttentionModules, phase: str) -> list[str]:
    """The attention modules to draw, in model order (modules the tree lacks after, by name).

    Raises:
        ValueError: the run recorded no attention, none in ``phase``, or ``modules`` names
            none of the modules that made attention calls.
    """
    frame = run.sql("select distinct module, phase from attention")
    if frame.empty:
        raise ValueError(
            "the run recorded no attention: watch(model, attention=True) records each head's "
            "entropy on recorded steps"
        )
    present = set(frame.loc[frame["phase"] == phase, "module"])
    if not present:
        raise ValueError(f"phase: no attention rows in phase {phase!r}")
    ordered = [info.name for info in run.modules if info.name in present]
    ordered += sorted(present - set(ordered))
    if modules is None:
        return ordered
    if isinstance(modules, str):
        if modules in present:
            return [modules]
        pattern = re.compile(modules)
        chosen = [name for name in ordered if pattern.search(name)]
    else:
        unknown = [name for name in modules if name not in present]
        if unknown:
            raise ValueError(f"module: {unknown} made no attention calls; these did: {ordered}")
        chosen = [name for name in ordered if name in set(modules)]
    if not chosen:
        raise ValueError(f"module: {modules!r} matches none of the attention modules {ordered}")
    return chosen


def read_heads(run: RunTables, names: list[str], value: str, phase: str) -> pandas.DataFrame:
    """step, module, call, head, keys and ``value`` of the lowest rank's rows of ``names``."""
    return run.sql(
        f"select step, module, call, head, keys, {quote_identifier(value)} as value from attention"
        f" where phase = $phase and module in (select name from {PICKED_MODULES})"
        " and rank = (select min(rank) from attention where phase = $phase)",
        {"phase": phase, "names": names},
    )


def head_matrix(
    frame: pandas.DataFrame, steps: np.ndarray, axis: str = "step"
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """One module's (call, head) rows, in order, and a float64 (rows, steps) matrix.

    ``frame`` holds call, head, ``axis`` (the column whose values ``steps`` lists, in order)
    and value. NaN where a head has no row at a step.
    """
    keys = sorted(set(zip(frame["call"].astype(int), frame["head"].astype(int), strict=True)))
    row_of = {key: index for index, key in enumerate(keys)}
    values = np.full((len(keys), len(steps)), np.nan)
    rows = [row_of[(int(c), int(h))] for c, h in zip(frame["call"], frame["head"], strict=True)]
    columns = np.searchsorted(steps, frame[axis].to_numpy(dtype=np.int64))
    values[rows, columns] = frame["value"].to_numpy(dtype=np.float64, na_value=np.nan)
    return keys, values


def _label_heads(axes: Axes, rows: list[tuple[int, int]]) -> None:
    """Tick labels of a panel's rows: the head, or ``call:head`` where there are several calls."""
    several = len({call for call, _ in rows}) > 1
    labels = [f"{call}:{head}" if several else str(head) for call, head in rows]
    axes.set_yticks(np.arange(len(rows)), labels)
    axes.set_ylabel("call:head" if several else "head")
