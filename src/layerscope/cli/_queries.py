"""SQL over a run for the commands: only the columns a command shows, never ``hist``.

A large run is never widened into pandas whole: DuckDB reads the few columns a query names
from the Parquet files and returns one row per layer, or the rows of one step. Values are
bound as parameters (``$phase``, ``$rank``); column names come from ``SHOWN_STATS`` only,
quoted by ``quote_identifier``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope.cli._open import CommandError
from layerscope.model import Kind, quote_identifier

if TYPE_CHECKING:
    import pandas

    from layerscope.store import Run

#: The kinds a run can hold, for ``--kind``.
KIND_NAMES = tuple(kind.value for kind in Kind)
#: The statistics the commands compare, as stored: a run recorded with ``stats=[...]`` may
#: lack some. ``nonfinite`` is derived: ``nan_count + inf_count``.
SHOWN_STATS = ("mean", "std", "absmax", "l2", "zero_frac", "nonfinite")


def stats_columns(run: Run) -> frozenset[str]:
    """The columns the run's stats table has (its files', or its configuration's if none)."""
    return frozenset(run.sql("select * from stats limit 0").columns)


def recorded(columns: frozenset[str]) -> frozenset[str]:
    """Which of ``SHOWN_STATS`` a stats table with ``columns`` can give."""
    found = {stat for stat in SHOWN_STATS if stat in columns}
    if {"nan_count", "inf_count"} & columns:
        found.add("nonfinite")
    return frozenset(found)


def lowest_rank(run: Run) -> int:
    """The rank a command shows unless told: rank 0, or the lowest that wrote."""
    ranks = [int(entry["rank"]) for entry in run.meta.get("ranks", ())]
    return min(ranks, default=0)


def checked_rank(run: Run, rank: int | None, named: str = "the run") -> int:
    """``rank``, or the lowest rank where None; a CommandError for a rank the run lacks.

    ``named``: the run as the error names it; a command of two runs says which lacks it.
    """
    if rank is None:
        return lowest_rank(run)
    ranks = sorted(int(entry["rank"]) for entry in run.meta.get("ranks", ())) or [0]
    if rank not in ranks:
        wrote = ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
        raise CommandError(f"--rank {rank}: {named} has no such rank; its ranks: {wrote}")
    return rank


def row_filter(columns: frozenset[str]) -> str:
    """The ``where`` condition of full rows of ``$phase`` and ``$rank``: no sentinel rows."""
    condition = "phase = $phase and rank = $rank"
    if "sentinel" in columns:  # sentinel rows hold min, max and absmax only
        condition += " and not coalesce(sentinel, false)"
    return condition


def row_params(phase: str, rank: int, **more: object) -> dict[str, object]:
    """The values of ``row_filter``'s parameters, and ``more``."""
    if not isinstance(phase, str):
        raise TypeError(f"phase: expected a string, got {type(phase).__name__}")
    return {"phase": phase, "rank": int(rank), **more}


def stat_expressions(columns: frozenset[str]) -> str:
    """``SHOWN_STATS`` as select expressions, as doubles, null where the run has no column."""
    expressions = []
    for stat in SHOWN_STATS:
        if stat == "nonfinite":
            counts = [name for name in ("nan_count", "inf_count") if name in columns]
            value = " + ".join(f"coalesce({quote_identifier(name)}, 0)" for name in counts)
            value = value or "null"
        else:
            value = quote_identifier(stat) if stat in columns else "null"
        expressions.append(f"({value})::double as {quote_identifier(stat)}")
    return ", ".join(expressions)


def steps_of(run: Run, phase: str, rank: int) -> list[int]:
    """The steps with full rows of ``phase`` and ``rank``, in order."""
    columns = stats_columns(run)
    frame = run.sql(
        f"select distinct step from stats where {row_filter(columns)} order by step",
        row_params(phase, rank),
    )
    return [int(step) for step in frame["step"]]


def rows_at_step(run: Run, step: int, phase: str, rank: int) -> pandas.DataFrame:
    """module, kind, tensor, call and ``SHOWN_STATS`` of every full row of one step."""
    columns = stats_columns(run)
    return run.sql(
        f"select module, kind, tensor, call, {stat_expressions(columns)} from stats "
        f"where step = $step and {row_filter(columns)} order by module, kind, tensor, call",
        row_params(phase, rank, step=int(step)),
    )


def layer_trends(run: Run, phase: str, rank: int) -> pandas.DataFrame:
    """One row per module and kind: its first and last step, and each stat at both.

    A module's tensors and calls of one kind (a Linear's weight and bias, a module called
    twice) are pooled into one value per step as if they were one tensor: L2 norms combine
    as the root of the sum of squares, abs-max as the maximum, mean and zero fraction
    weighted by ``numel``, std by the pooled variance (Chan), NaN and Inf counts summed.

    Returns:
        module, kind, first_step, last_step, and ``<stat>_first``, ``<stat>_last`` for each
        of ``SHOWN_STATS``.
    """
    columns = stats_columns(run)
    ends = ", ".join(
        f"arg_min({quote_identifier(stat)}, step) as {quote_identifier(stat + '_first')}, "
        f"arg_max({quote_identifier(stat)}, step) as {quote_identifier(stat + '_last')}"
        for stat in SHOWN_STATS
    )
    # Only each layer's first and last steps are pooled: a long run's other steps are most
    # of its rows, and the window below would sort them all.
    return run.sql(
        f"""
        with ends as (
            select module, kind, min(step) as first_step, max(step) as last_step
            from stats where {row_filter(columns)} group by module, kind
        ),
        readings as (
            select module, kind, step, numel::double as n, {stat_expressions(columns)}
            from stats join ends using (module, kind)
            where {row_filter(columns)} and step in (ends.first_step, ends.last_step)
        ),
        centred as (
            select *, sum(n * mean) over tensors / sum(n) over tensors as layer_mean
            from readings window tensors as (partition by module, kind, step)
        ),
        pooled as (
            select module, kind, step,
                sum(n * mean) / sum(n) as mean,
                case when count(*) = 1 then any_value(std) else sqrt(
                    (sum((n - 1) * std * std)
                        + sum(n * (mean - layer_mean) * (mean - layer_mean)))
                    / (sum(n) - 1)
                ) end as std,
                max(absmax) as absmax,
                sqrt(sum(l2 * l2)) as l2,
                sum(n * zero_frac) / sum(n) as zero_frac,
                sum(nonfinite) as nonfinite
            from centred group by module, kind, step
        )
        select module, kind, min(step) as first_step, max(step) as last_step, {ends}
        from pooled group by module, kind
        """,
        row_params(phase, rank),
    )
