"""One layer's histograms: over steps (the "color_dim" picture) and at one step.

Histograms are stored trimmed (``hist`` from slot ``hist_lo`` on): DuckDB unnests them into
(slot, count) cells and sums the cells of each column of steps, so only the chosen layer's
counts leave the database. Columns of several steps hold the mean count per step.

Each answer says its ``scale``. A log2 histogram (``"log2"``) is shown over the exponents of
the magnitude slots that hold a count, its zeros and its Inf/NaN slot apart. A linear one
(``"linear"``, ``histogram=("linear", lo, hi, bins)``) is shown in value units, every slot:
``bounds`` are where each slot is drawn, as the matplotlib figures draw it (its underflow and
overflow slots as bands beyond lo and hi, named by ``open_slots``); NaN is in no slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas

from layerscope.plots import PICKED_MODULES, histogram_edges, is_linear, value_axis, widen
from layerscope.stats import check_fits
from layerscope.store import Run
from layerscope.ui._encode import integers, numbers, pack
from layerscope.ui._heatmap import merges
from layerscope.ui._query import Selection, check_module


def color_dim(run: Run, selection: Selection, module: str, width: int) -> dict[str, Any]:
    """The layer's histogram over steps: slots (rows) by columns of steps.

    Returns:
        ``steps`` and ``last_steps`` of each column; ``counts``, a packed (slots, columns)
        matrix of mean counts per step; ``totals``, the elements counted per column; and the
        slots, as ``_slots`` describes them for the run's ``scale``.

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
    shown, described = _slots(edges, counts)
    return {
        "module": module,
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
        "steps": first,
        "last_steps": last,
        **described,
        "counts": pack(counts[shown]),
        **_apart(edges, counts, numbers),
        "totals": numbers(counts.sum(axis=0)),
        "width": width,
        "aggregate": "mean" if merges(first, last) else None,
        "downsampled": merges(first, last),
    }


def _slots(edges: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The slots a picture of ``counts`` (slots, columns) shows, and how to draw them.

    Log2: ``exponents``, the log2 of each shown slot's lower edge (the magnitude slots from
    the lowest to the highest that holds a count). Linear: every slot; ``bounds``, slot ``i``
    drawn from ``bounds[i]`` to ``bounds[i + 1]`` in value units; ``open_slots``, what the
    underflow and overflow slots hold (``"< lo"``, ``"≥ hi"``).
    """
    axis = value_axis(edges, counts)
    if axis.linear:
        described = {"bounds": numbers(axis.bounds), "open_slots": list(axis.open_slot_names())}
        return axis.slots, {"scale": "linear", **described}
    return axis.slots, {"scale": "log2", "exponents": integers(np.log2(edges[axis.slots]))}


def _apart(edges: np.ndarray, counts: np.ndarray, convert: Any) -> dict[str, Any]:
    """A log2 histogram's slots without an exponent: zeros (and subnormals), Inf/NaN.

    A linear histogram has none: 0 is a value among the others, Inf in its open slots.
    """
    if is_linear(edges):
        return {}
    return {"zeros": convert(counts[0]), "infinite": convert(counts[-1])}


def distribution(run: Run, selection: Selection, module: str, step: int) -> dict[str, Any]:
    """The layer's histogram at one recorded step, as fractions of its elements.

    Returns:
        ``step``; ``fractions`` of the slots shown, described as in ``color_dim``; for a log2
        histogram the fractions of ``zeros`` and ``infinite`` values; ``total`` elements
        counted. ``step`` is None where that step has no row.
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
    shown, described = _slots(edges, counts[:, None])
    return {
        "module": module,
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
        "step": int(step),
        **described,
        "fractions": numbers(fractions[shown]),
        **_apart(edges, fractions, float),
        "total": total,
    }
