"""The summary's spread across ranks: where one rank's activations or gradients stand apart.

On a job of many ranks the layers table shows one rank. Each rank trains on its own data, so
its activations and output gradients differ from the others'; a rank whose gradient norm is
several times the median is the one to look at (bad data, a faulty device). One query over
every rank's rows of the last recorded step gives, per module and kind, the median L2 norm
across ranks and the ranks at both ends. Parameters and their gradients are left out: after
DDP's all-reduce every rank holds the same ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from layerscope.cli import _format
from layerscope.cli._console import Column, Table
from layerscope.cli._layers import shown_name

if TYPE_CHECKING:
    import pandas

    from layerscope.store import Run

#: Kinds that differ from rank to rank: each rank's own data flows through them.
PER_RANK_KINDS = ("activation", "grad", "input", "input_grad")
#: How many modules the table lists, those whose ranks differ most first.
SHOWN = 10


def rank_spread(run: Run, phase: str, columns: frozenset[str]) -> pandas.DataFrame:
    """Per module and kind at the last step every rank recorded: median, lowest, highest L2.

    Returns:
        step, module, kind, ranks, median, low, low_rank, high, high_rank; the modules whose
        highest rank stands furthest above the median (or lowest below it) first.
    """
    full_rows = "not coalesce(sentinel, false)" if "sentinel" in columns else "true"
    kinds = ", ".join(f"'{kind}'" for kind in PER_RANK_KINDS)  # constants, not input
    return run.sql(
        f"""
        with rows as (
            select step, rank, module, kind, l2 from stats
            where phase = $phase and kind in ({kinds}) and {full_rows} and l2 is not null
        ),
        last as (
            select max(step) as step from (
                select step from rows group by step
                having count(distinct rank) = (select count(distinct rank) from rows)
            )
        ),
        per_rank as (
            select rows.step, module, kind, rank, sqrt(sum(l2 * l2)) as l2
            from rows join last on rows.step = last.step
            group by rows.step, module, kind, rank
        ),
        spread as (
            select step, module, kind, count(*) as ranks, median(l2) as median,
                min(l2) as low, arg_min(rank, l2) as low_rank,
                max(l2) as high, arg_max(rank, l2) as high_rank
            from per_rank group by step, module, kind
        )
        select * from spread
        order by greatest(high / nullif(median, 0), median / nullif(low, 0)) desc nulls last,
            module, kind
        limit $limit
        """,
        {"phase": phase, "limit": SHOWN},
    )


def spread_table(spread: pandas.DataFrame, world: int) -> Table | None:
    """The spread as a table; None where no step has rows of every rank."""
    if spread.empty:
        return None
    step = int(spread.step.iloc[0])
    table = Table(
        f"spread across {world} ranks (step {step}, L2 of each rank's rows; the modules whose "
        f"ranks differ most first)",
        [
            Column("module"),
            Column("kind"),
            Column("median", numeric=True),
            Column("lowest (rank)", numeric=True),
            Column("highest (rank)", numeric=True),
            Column("highest / median", numeric=True),
        ],
    )
    for row in spread.itertuples():
        median, high = float(row.median), float(row.high)
        share = high / median if median > 0 and math.isfinite(high) else None
        table.add(
            [
                shown_name(str(row.module)),
                str(row.kind),
                _format.number(median),
                f"{_format.number(float(row.low))} ({int(row.low_rank)})",
                f"{_format.number(high)} ({int(row.high_rank)})",
                "-" if share is None else f"{share:.2f}",
            ]
        )
    return table
