"""What a run view shows around its charts: the run, its options, modules, scalars and alerts.

Each function takes a ``Run`` and returns plain JSON-ready data; every table is read through
``run.sql`` with only the rows and columns shown.
"""

from __future__ import annotations

import math
from typing import Any

from layerscope.plots import DEFAULT_TENSOR, LOG_SCALE_STATS, PHASES
from layerscope.stats import PRECISION_STATS
from layerscope.store import Run, RunFileError
from layerscope.ui._encode import integers, numbers
from layerscope.ui._lost import lost_stats

# Statistics of the run's configuration that are not one number per row: no chart shows them.
_NOT_SHOWN = frozenset(("hist", "hist_lo"))
# Scalar series longer than this are thinned to every n-th step for the page.
MAX_SCALAR_POINTS = 5000


def statistics(run: Run) -> list[str]:
    """The numeric statistics the run recorded, in the order of its configuration."""
    config = run.meta.get("config", {})
    names = [*config.get("stats", ()), *config.get("custom_stats", ())]
    shown = [name for name in names if name not in _NOT_SHOWN and name not in PRECISION_STATS]
    return shown + lost_stats(names)


def summary(run: Run, run_id: str) -> dict[str, Any]:
    """The run's identity, status, ranks, recorded kinds and tensors, and its own overhead.

    ``run`` should be freshly loaded: its ``meta`` says how far a running run has come.
    """
    meta = run.meta
    # "group by" rather than "distinct", "is not true" rather than coalesce(): 170 ms rather
    # than 270 over 8 million rows.
    present = run.sql(
        "select rank, phase, kind, tensor from stats where sentinel is not true"
        " group by all order by all"
    )
    kinds: dict[str, list[str]] = {}
    for kind, tensor in zip(present["kind"], present["tensor"], strict=True):
        if kind in DEFAULT_TENSOR and tensor not in kinds.setdefault(kind, []):
            kinds[kind].append(tensor)
    for tensors in kinds.values():  # the figures' default tensor first
        tensors.sort(key=lambda tensor: (tensor not in DEFAULT_TENSOR.values(), tensor))
    ranks = sorted({int(rank) for rank in present["rank"]} | _meta_ranks(meta))
    return {
        "id": run_id,
        "name": meta.get("name"),
        "status": meta.get("status"),
        "steps": meta.get("steps"),
        "started": meta.get("started"),
        "ended": meta.get("ended"),
        "updated": meta.get("updated"),
        "host": meta.get("host"),
        "ranks": ranks or [0],
        "phases": [phase for phase in PHASES if phase in set(present["phase"])] or ["train"],
        "kinds": kinds,
        "default_tensor": DEFAULT_TENSOR,
        "stats": statistics(run),
        "log_scale_stats": sorted(LOG_SCALE_STATS),
        "histograms": bool(meta.get("histogram_edges"))
        and "hist" in meta.get("config", {}).get("stats", ()),
        "overhead": overhead(meta),
        "versions": meta.get("versions", {}),
    }


def _meta_ranks(meta: dict[str, Any]) -> set[int]:
    return {int(entry["rank"]) for entry in meta.get("ranks", ()) if "rank" in entry}


def overhead(meta: dict[str, Any]) -> dict[str, Any]:
    """The cost of recording, as the run noted it, with the training thread's per step.

    While a run is written (``live``), ``run.json`` carries the training thread's seconds and
    the kernel from its first flush on, but the writer's seconds only at close: a value not
    written yet is None, never the 0 ``run.json`` starts with. A crashed run never wrote them.
    """
    live = meta.get("status") == "running"
    closed = not live and meta.get("status") != "crashed"
    steps = meta.get("steps") or 0
    cost = meta.get("cost_seconds")
    if not closed and not cost:
        cost = None  # no flush has noted it yet
    return {
        "live": live,
        "cost_seconds": cost,
        "writer_seconds": meta.get("writer_seconds") if closed else None,
        "cost_ms_per_step": 1000 * cost / steps if cost is not None and steps else None,
        "steps": meta.get("steps"),
        "kernel": meta.get("kernel"),
        "recorded_rows": meta.get("recorded_rows"),
        "written_rows": meta.get("written_rows"),
        "dropped_rows": meta.get("dropped_rows"),
        "failures": meta.get("failures"),
        "ranks": meta.get("ranks", []),
    }


def modules(run: Run) -> list[dict[str, Any]]:
    """The module tree in model order: name, type, parameter shapes and counts, children."""
    return [info.to_dict() for info in run.modules]


def scalars(run: Run, rank: int) -> dict[str, Any]:
    """Each scalar's steps and values, thinned evenly where a series is very long."""
    frame = run.sql(
        "select name, step, value from scalars where rank = $rank order by name, step",
        {"rank": int(rank)},
    )
    series = {}
    for name, rows in frame.groupby("name", sort=True):
        stride = max(1, math.ceil(len(rows) / MAX_SCALAR_POINTS))
        kept = rows.iloc[::stride]
        series[str(name)] = {
            "steps": integers(kept["step"]),
            "values": numbers(kept["value"]),
            "stride": stride,
        }
    return {"rank": rank, "scalars": series}


def alerts(run: Run, rank: int) -> dict[str, Any]:
    """The health rules' alerts of one rank, by step, then in model order, then as raised.

    Model order, not text order: module "2" before "10".
    """
    frame = run.sql(
        "select step, phase, rule, module, kind, tensor, severity, value, threshold, message"
        " from alerts where rank = $rank",
        {"rank": int(rank)},
    )
    try:
        place = {info.name: index for index, info in enumerate(run.modules)}
    except RunFileError:  # a damaged module tree: the alerts still answer, modules as text
        place = {}
    records = frame.to_dict("records")
    records.sort(  # stable: a step's alerts of one module keep the rules' order
        key=lambda row: (
            int(row["step"]),
            place.get(str(row["module"]), len(place)),
            str(row["module"]),
        )
    )
    rows = []
    for record in records:
        value, threshold = numbers([record["value"], record["threshold"]])
        rows.append(
            {
                **{key: _text(record[key]) for key in ("phase", "rule", "module", "kind")},
                **{key: _text(record[key]) for key in ("tensor", "severity", "message")},
                "step": int(record["step"]),
                "value": value,
                "threshold": threshold,
            }
        )
    return {"rank": rank, "alerts": rows}


def _text(value: Any) -> str | None:
    return None if value is None or value != value else str(value)
