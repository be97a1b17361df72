"""The attention panel: each attention module's heads by steps of their entropy fraction.

It reads the ``attention`` table (``watch(attention=True)``): one row per head of each
attention call on recorded steps. ``entropy_frac`` is each query's attention entropy over the
log of the keys it may attend to, averaged: 1 spread evenly, 0 all weight on one key. Over
many steps, columns are buckets of ``width`` steps as in the heat map (``_query``), each
showing its lowest fraction, so a head that collapsed for one step is never averaged away.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.model import quote_identifier
from layerscope.plots import head_matrix
from layerscope.store import Run
from layerscope.ui._encode import integers, pack
from layerscope.ui._heatmap import merges

#: The column drawn, and how a bucket of steps aggregates it.
VALUE = "entropy_frac"
AGGREGATE = "min"


def attention(run: Run, phase: str, rank: int, width: int) -> dict[str, Any]:
    """Every attention module of one phase and rank: heads by columns of ``width`` steps.

    Returns:
        ``phases``, those the run recorded attention in (none: the run recorded no
        attention, and the page shows no panel); ``modules``, in model order, each with its
        ``module`` name, its module ``type``, the ``calls`` and ``heads`` of its rows and
        ``values``, a packed float32 (rows, columns) matrix of the entropy fraction, NaN
        where a head has no row; ``steps`` and ``last_steps``, the first and last recorded
        step of each column, the same for every module; ``width``, ``aggregate`` and
        ``downsampled``, how columns were made.
    """
    phases = run.sql("select distinct phase from attention order by phase")["phase"].tolist()
    value = quote_identifier(VALUE)
    if width == 1:
        steps_clause, group = "step as bucket, step as first, step as last", ""
    else:
        steps_clause = "step // $width as bucket, min(step) as first, max(step) as last"
        value, group = f"{AGGREGATE}({value})", " group by all"
    frame = run.sql(
        f"select module, call, head, {steps_clause}, {value} as value from attention"
        f" where phase = $phase and rank = $rank{group}",
        {"phase": phase, "rank": int(rank), **({"width": int(width)} if width > 1 else {})},
    )
    buckets = np.unique(frame["bucket"].to_numpy(dtype=np.int64))
    spans = frame.groupby("bucket").agg(first=("first", "min"), last=("last", "max"))
    first, last = integers(spans["first"]), integers(spans["last"])
    types = {info.name: info.type for info in run.modules}
    present = set(frame["module"])
    ordered = [name for name in types if name in present] + sorted(present - set(types))
    merged = merges(first, last)
    return {
        "phase": phase,
        "rank": int(rank),
        "phases": [str(name) for name in phases],
        "value": VALUE,
        "modules": [
            _module(frame[frame["module"] == name], name, types.get(name), buckets)
            for name in ordered
        ],
        "steps": first,
        "last_steps": last,
        "width": width,
        "aggregate": AGGREGATE if merged else None,
        "downsampled": merged,
    }


def _module(rows: Any, name: str, module_type: str | None, buckets: np.ndarray) -> dict[str, Any]:
    """One module's rows as (call, head) rows by columns."""
    keys, values = head_matrix(rows, buckets, "bucket")
    return {
        "module": name,
        "type": module_type,
        "calls": [call for call, _ in keys],
        "heads": [head for _, head in keys],
        "values": pack(values),
    }
