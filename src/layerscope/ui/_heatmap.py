"""The layers-by-steps heat map of one statistic, and one layer's statistics over steps.

Both come from one grouped SQL query each, downsampled to at most ``MAX_COLUMNS`` columns of
steps (see ``_query``): a run of 200 layers by 10,000 steps answers with 200 x 1,000 values,
never 2 million rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas

from layerscope.model import quote_identifier
from layerscope.plots import LOG_SCALE_STATS, PICKED_MODULES
from layerscope.store import Run
from layerscope.ui._encode import integers, pack
from layerscope.ui._lost import LOST_STATS, check_chart_stat, expression
from layerscope.ui._overview import statistics
from layerscope.ui._query import Selection, aggregate, check_module

# Statistics that are fractions of a tensor's values: coloured from 0 to 1, not over their own
# spread, where a layer losing 97% of its values would take the colour of "fine".
FRACTIONS = frozenset({"zero_frac", "neg_frac", "pos_frac", *LOST_STATS})


def _grouped(width: int) -> tuple[str, str]:
    """The select list's step columns and the group clause for buckets of ``width`` steps."""
    if width == 1:
        return "step as bucket, step as first, step as last", ""
    return "step // $width as bucket, min(step) as first, max(step) as last", " group by all"


def _width(width: int) -> dict[str, int]:
    """The ``$width`` parameter ``_grouped``'s clause has, where it has one."""
    return {} if width == 1 else {"width": int(width)}


def heatmap(run: Run, selection: Selection, stat: str, width: int) -> dict[str, Any]:
    """Layers (model order) by columns of ``width`` steps: one statistic, aggregated per column.

    Returns:
        ``layers`` and their module ``types`` (a compared run's layer is the same layer only
        where both match); ``steps`` and ``last_steps``, the first and last recorded step of each
        column; ``values``, a packed float32 (layers, columns) matrix, NaN where a layer has
        no row; ``width``, ``aggregate`` and ``downsampled``, how columns were made;
        ``log_scale`` and ``fraction``, how it is coloured (a fraction from 0 to 1).

    Raises:
        ValueError: an unknown statistic (naming ``stat``), kind or phase.
    """
    check_chart_stat(run, stat)
    how = aggregate(stat)
    steps_clause, group = _grouped(width)
    value = expression(stat) if width == 1 else f"{how}({expression(stat)})"
    frame = run.sql(
        f"select module, {steps_clause}, {value} as value from stats"
        f" where {selection.where()}{group}",
        selection.params(**_width(width)),
    )
    # Modules as codes: 200,000 rows name ~200 modules, and Python never sees each row's.
    codes, names = pandas.factorize(frame["module"])
    present = {str(name): code for code, name in enumerate(names)}
    shown = [info for info in run.modules if info.name in present]
    layers = [info.name for info in shown]
    buckets = np.unique(frame["bucket"].to_numpy(dtype=np.int64))
    values = np.full((len(layers), len(buckets)), np.nan)
    if len(frame):
        row_of_code = np.full(len(names), -1)
        for row, name in enumerate(layers):
            row_of_code[present[name]] = row
        rows = row_of_code[codes]
        known = rows >= 0  # a module missing from modules.json has no row to go in
        columns = np.searchsorted(buckets, frame["bucket"].to_numpy(dtype=np.int64))
        cells = frame["value"].to_numpy(dtype=np.float64, na_value=np.nan)
        values[rows[known], columns[known]] = cells[known]
    first, last = _column_steps(frame, buckets)
    merged = merges(first, last)
    return {
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
        "stat": stat,
        "log_scale": stat in LOG_SCALE_STATS,
        "fraction": stat in FRACTIONS,
        "layers": layers,
        "types": [info.type for info in shown],
        "steps": first,
        "last_steps": last,
        "values": pack(values),
        "width": width,
        "aggregate": how if merged else None,
        "downsampled": merged,
    }


def merges(first: list[int], last: list[int]) -> bool:
    """Whether a column holds more than one recorded step.

    With ``every=2`` and columns of 2 steps, each column is one recorded step: nothing is
    aggregated, and the page says "recorded steps", not "columns of 2 steps".

    Examples:
        >>> merges([0, 2], [0, 2]), merges([0, 2], [1, 2])
        (False, True)
    """
    return any(a != b for a, b in zip(first, last, strict=True))


def _column_steps(frame: Any, buckets: np.ndarray) -> tuple[list[int], list[int]]:
    """The first and last recorded step of each column, over all layers."""
    if not len(frame):
        return [], []
    spans = frame.groupby("bucket").agg(first=("first", "min"), last=("last", "max"))
    spans = spans.reindex(buckets)
    return integers(spans["first"]), integers(spans["last"])


def series(run: Run, selection: Selection, module: str, width: int) -> dict[str, Any]:
    """Every statistic of one layer over steps, each aggregated per column as in the heat map.

    Raises:
        ValueError: an unknown module, kind or phase.
    """
    check_module(run, module)
    found = series_of_layers(run, selection, [module], width)
    return found.get(module) or _series(selection, module, width, statistics(run), None)


def series_of_layers(
    run: Run, selection: Selection, modules: list[str] | None, width: int
) -> dict[str, dict[str, Any]]:
    """``series`` of each of ``modules`` (None: every layer) from one query: for the report."""
    names = statistics(run)
    steps_clause, group = _grouped(width)
    if width == 1:
        picked = ", ".join(f"{expression(name)} as {quote_identifier(name)}" for name in names)
    else:
        picked = ", ".join(
            f"{aggregate(name)}({expression(name)}) as {quote_identifier(name)}" for name in names
        )
    chosen, params = "", selection.params(**_width(width))
    if modules is not None:
        chosen = f" and module in (select name from {PICKED_MODULES})"
        params["names"] = list(modules)
    frame = run.sql(
        f"select module, {steps_clause}, {picked} from stats"
        f" where {selection.where()}{chosen}{group} order by module, bucket",
        params,
    )
    codes, found = pandas.factorize(frame["module"])
    return {
        str(name): _series(selection, str(name), width, names, frame[codes == code])
        for code, name in enumerate(found)
    }


def _series(
    selection: Selection, module: str, width: int, names: list[str], rows: Any
) -> dict[str, Any]:
    """The JSON of one layer's ``rows`` (None where it has none)."""
    empty = np.zeros(0)
    merged = rows is not None and merges(integers(rows["first"]), integers(rows["last"]))
    return {
        "module": module,
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
        "steps": [] if rows is None else integers(rows["first"]),
        "last_steps": [] if rows is None else integers(rows["last"]),
        "stats": {
            name: pack(empty if rows is None else rows[name].to_numpy(np.float64, na_value=np.nan))
            for name in names
        },
        "aggregates": {name: aggregate(name) for name in names} if merged else None,
        "width": width,
        "downsampled": merged,
    }
