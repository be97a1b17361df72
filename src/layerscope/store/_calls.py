"""The calls table: every recorded step's call order, stored once per change, read whole.

``calls.parquet`` holds a step's enter and exit events where its order differs from the one
stored before it, and one row with event ``same`` for a step that repeats it (so a run of
thousands of recorded steps stores its order once, and still names every step). Readers get
every recorded step's events: ``expand_orders`` for Arrow tables (``run.calls``, a scope's
frames) and ``EXPANDED_CALLS`` for DuckDB (the ``calls`` view; ``calls_stored`` is the file).
"""

from __future__ import annotations

from typing import Any

from layerscope._imports import require

#: The event of a step that repeats the order stored before it (as the hooks send it).
SAME = "same"

#: The ``calls`` view over ``calls_stored``: each ``same`` row replaced by the events of the
#: latest step of its rank stored whole at or before it, under its own step.
EXPANDED_CALLS = f"""
with orders as (
    select distinct rank, step as order_step from calls_stored where event <> '{SAME}'
), repeats as (
    select s.rank, s.step, o.order_step
    from (select rank, step from calls_stored where event = '{SAME}') s
    asof join orders o on s.rank = o.rank and o.order_step <= s.step
)
select step, seq, event, module, call, rank from calls_stored where event <> '{SAME}'
union all
select r.step, c.seq, c.event, c.module, c.call, c.rank
from repeats r join calls_stored c
    on c.rank = r.rank and c.step = r.order_step and c.event <> '{SAME}'
"""


def expand_orders(table: Any) -> Any:
    """``table`` (the calls of one or more ranks, as stored) with every step's events.

    Rows stay in the order stored; each ``same`` row becomes the events it repeats, there.
    A table without ``step`` (written before steps were) or without ``same`` rows is returned
    as it is.
    """
    pyarrow = require("pyarrow", "dataframe")
    names = table.column_names
    if "step" not in names or "event" not in names or table.num_rows == 0:
        return table
    events = table.column("event").to_pylist()
    if SAME not in events:
        return table
    steps = table.column("step").to_pylist()
    ranks = table.column("rank").to_pylist() if "rank" in names else [0] * len(events)
    take: list[int] = []
    new_steps: list[int] = []
    last: dict[Any, list[int]] = {}  # per rank: the rows of the order stored whole last
    for row, (event, step, rank) in enumerate(zip(events, steps, ranks, strict=True)):
        if event == SAME:
            rows = last.get(rank, [])
            take += rows
            new_steps += [step] * len(rows)
            continue
        order = last.get(rank)
        if order is None or steps[order[-1]] != step:
            order = last[rank] = []
        order.append(row)
        take.append(row)
        new_steps.append(step)
    expanded = table.take(pyarrow.array(take, pyarrow.int64()))
    index = names.index("step")
    step_type = table.schema.field("step").type
    return expanded.set_column(index, "step", pyarrow.array(new_steps, step_type))
