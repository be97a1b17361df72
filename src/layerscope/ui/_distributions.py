"""One layer's log2 histograms: over steps (the "color_dim" picture) and at one step.

Histograms are stored trimmed (``hist`` from slot ``hist_lo`` on): DuckDB unnests them into
(slot, count) cells and sums the cells of each column of steps, so only the chosen layer's
counts leave the database. Columns of several steps hold the mean count per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas

from layerscope.plots._histograms import histogram_edges, magnitude_slots, occupied_range, widen
from layerscope.plots._select import PICKED_MODULES
from layerscope.store import Run
from layerscope.store._damage import check_fits
from layerscope.ui._encode import integers, numbers, pack
from layerscope.ui._heatmap import merges
from layerscope.ui._query import Selection, check_module


def color_dim(run: Run, selection: Selection, module: str, width: int) -> dict[str, Any]:
    """The layer's histogram over steps: magnitude slots (rows) by columns of steps.

    Returns:
        ``steps`` and ``last_steps`` of each column; ``exponents``, the log2 of each shown
        slot's lower edge (the slots from the lowest to the highest that holds a count);
        ``counts``, a packed (slots, columns) matrix of mean counts per step; ``zeros`` and
        ``infinite``, the exact zeros and infinities per column, which have no log2 slot;
        ``totals``, the elements counted per column.

    Raises:
        ValueError: the run kept no histograms, or an unknown module, kind or phase.
    """
    check_module(run, module)
    found = color_dims(run, selection, [module], width)
    if module in found:
        return found[module]
    edges = histogram_edges(run)
    return _color_dim(selection, module, width, edges, np.zeros(0, np.int64), None)


def color_dims(
    run: Run, selection: Selection, modules: list[str] | None, width: int
) -> dict[str, dict[str, Any]]:
    """``color_dim`` of each of ``modules`` (None: every layer) from one query."""
    edges = histogram_edges(run)
    chosen, params = "", selection.params(width=int(width))
    if modules is not None:
        chosen = f" and module in (select name from {PICKED_MODULES})"
        params["names"] = list(modules)
    frame = run.sql(
        "with picked as materialized ("
        f" select module, step, hist_lo, hist from stats where {selection.where()}{chosen}"
        " and hist is not null),"
        " counted as (select module, step // $width as bucket, count(*) as steps_in_bucket,"
        " min(step) as first, max(step) as last from picked group by all),"
        " cells as (select module, step // $width as bucket,"
        " hist_lo + generate_subscripts(hist, 1) - 1 as slot, unnest(hist) as count"
        " from picked),"
        " summed as (select module, bucket, slot, sum(count) as count from cells group by all)"
        " select * from summed join counted using (module, bucket)",
        params,
    )
    codes, found = pandas.factorize(frame["module"])
    layers = {}
    for code, name in enumerate(found):
        rows = frame[codes == code]
        buckets = np.unique(rows["bucket"].to_numpy(dtype=np.int64))
        layers[str(name)] = _color_dim(selection, str(name), width, edges, buckets, rows)
    return layers


def _color_dim(
    selection: Selection,
    module: str,
    width: int,
    edges: np.ndarray,
    buckets: np.ndarray,
    rows: Any,
) -> dict[str, Any]:
    """The JSON of one layer's (bucket, slot) ``rows`` (None where it has none)."""
    counts = np.zeros((len(edges), len(buckets)))
    first: list[int] = []
    last: list[int] = []
    if rows is not None and len(rows):
        columns = np.searchsorted(buckets, rows["bucket"].to_numpy(dtype=np.int64))
        steps = rows["steps_in_bucket"].to_numpy(dtype=np.float64)
        per_step = rows["count"].to_numpy(dtype=np.float64) / steps
        slots = rows["slot"].to_numpy(dtype=np.int64)
        check_fits(int(slots.min()), int(slots.max() - slots.min() + 1), len(edges))
        counts[slots, columns] = per_step
        spans = rows.groupby("bucket").agg(first=("first", "min"), last=("last", "max"))
        first, last = integers(spans["first"]), integers(spans["last"])
    shown = occupied_range(counts, magnitude_slots(edges), edges)
    return {
        "module": module,
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
        "steps": first,
        "last_steps": last,
        "exponents": integers(np.log2(edges[shown])),
        "counts": pack(counts[shown]),
        "zeros": numbers(counts[0]),
        "infinite": numbers(counts[-1]),
        "totals": numbers(counts.sum(axis=0)),
        "width": width,
        "aggregate": "mean" if merges(first, last) else None,
        "downsampled": merges(first, last),
    }


def distribution(run: Run, selection: Selection, module: str, step: int) -> dict[str, Any]:
    """The layer's histogram at one recorded step, as fractions of its elements.

    Returns:
        ``step``; ``exponents`` and ``fractions`` of the occupied magnitude slots; the
        fractions of ``zeros`` and ``infinite`` values; ``total`` elements counted. ``step``
        is None where that step has no row.
    """
    edges = histogram_edges(run)
    check_module(run, module)
    frame = run.sql(
        f"select hist_lo, hist from stats where {selection.where()}"
        " and module = $module and step = $step and hist is not null",
        selection.params(module=module, step=int(step)),
    )
    if not len(frame):
        return {"module": module, "step": None}
    counts = widen(frame["hist_lo"].iloc[0], frame["hist"].iloc[0], len(edges))
    total = float(counts.sum())
    fractions = counts / total if total else counts
    shown = occupied_range(counts[:, None], magnitude_slots(edges), edges)
    return {
        "module": module,
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
        "step": int(step),
        "exponents": integers(np.log2(edges[shown])),
        "fractions": numbers(fractions[shown]),
        "zeros": float(fractions[0]),
        "infinite": float(fractions[-1]),
        "total": total,
    }
