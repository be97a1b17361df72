"""The summary's attention heads: those whose attention is sharpest at the latest step.

A run recorded with ``watch(attention=True)`` has a row per head of each attention call on
recorded steps (the ``attention`` table). The heads with the lowest entropy fraction (each
query's entropy over the log of the keys it may attend to, averaged: 0 is all weight on one
key) at the last step the table holds are shown beside what they were at its first, so a
collapsed head reads as one that fell, and a head sharp from the start as one that did not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope.cli import _format
from layerscope.cli._console import Column, Table

if TYPE_CHECKING:
    from layerscope.store import Run

#: How many heads the summary shows.
TOP = 5


def attention_table(run: Run, phase: str, rank: int) -> Table | None:
    """The ``TOP`` heads of lowest entropy fraction at the latest step; None without rows."""
    frame = run.sql(
        """
        with heads as (
            select module, call, head, min(step) as first_step, max(step) as last_step,
                arg_min(entropy_mean, step) as entropy_first,
                arg_max(entropy_mean, step) as entropy_last,
                arg_min(entropy_frac, step) as frac_first,
                arg_max(entropy_frac, step) as frac_last,
                arg_min(max_prob, step) as prob_first,
                arg_max(max_prob, step) as prob_last
            from attention where phase = $phase and rank = $rank
            group by module, call, head
        )
        select *, (select count(distinct call) > 1 from heads h where h.module = heads.module)
            as several_calls
        from heads where last_step = (select max(last_step) from heads)
        order by frac_last, module, call, head limit $top
        """,
        {"phase": phase, "rank": int(rank), "top": TOP},
    )
    if frame.empty:
        return None
    last, first = int(frame["last_step"].iloc[0]), int(frame["first_step"].min())
    title = (
        f"attention heads with the lowest entropy fraction (phase {phase}, rank {rank}, "
        f"step {last}; at step {first} in brackets)"
    )
    table = Table(
        title,
        [
            Column("module"),
            Column("head"),
            Column("entropy nats", numeric=True),
            Column("fraction", numeric=True),
            Column("max prob", numeric=True),
        ],
    )
    for row in frame.itertuples(index=False):
        head = f"{row.head} (call {row.call})" if row.several_calls else str(row.head)
        if row.first_step != first:  # a head that made no call at the first step
            head += f" (from step {row.first_step})"
        table.add(
            [
                _format.text(row.module) or "(root)",
                head,
                _then(row.entropy_last, row.entropy_first),
                _then(row.frac_last, row.frac_first),
                _then(row.prob_last, row.prob_first),
            ]
        )
    return table


def _then(latest: float, first: float) -> str:
    """``latest (first)``, each to 3 significant digits.

    Examples:
        >>> _then(0.01234, 0.9876)
        '0.0123 (0.988)'
    """
    return f"{latest:.3g} ({first:.3g})"
