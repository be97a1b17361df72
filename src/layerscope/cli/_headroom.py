"""The summary's fp8 headroom: the tensors that would lose most values in e4m3 and e5m2.

At the latest recorded step, each tensor's values that the format could not hold (finite ones
above its largest value, nonzero ones below its smallest subnormal: the run's ``{fmt}_over``
and ``{fmt}_under``), as a fraction of its elements, its calls pooled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope.cli._queries import row_filter, row_params, stats_columns, steps_of
from layerscope.model import quote_identifier
from layerscope.stats import Format, format_named

if TYPE_CHECKING:
    import pandas

    from layerscope.store import Run

#: The formats the summary names, and how many tensors each.
SHOWN_FORMATS = ("e4m3", "e5m2")
TOP = 3
# The tensor a kind's name stands for, left unsaid.
_MAIN_TENSORS = frozenset(("out", "weight"))


def headroom_fields(run: Run, phase: str, rank: int) -> tuple[str, list[tuple[str, str]]] | None:
    """A title and one line per format; None where the run has no counts or no full rows."""
    columns = stats_columns(run)
    formats = [format_named(name) for name in SHOWN_FORMATS]
    formats = [fmt for fmt in formats if fmt.over in columns and fmt.under in columns]
    steps = steps_of(run, phase, rank)
    if not formats or not steps:
        return None
    counts = ", ".join(
        f"sum({name}) as {name}"
        for fmt in formats
        for name in map(quote_identifier, (fmt.over, fmt.under))
    )
    first = quote_identifier(formats[0].over)
    frame = run.sql(
        f"select module, kind, tensor, sum(numel) as numel, {counts} from stats "
        f"where step = $step and {row_filter(columns)} and {first} is not null "
        "group by module, kind, tensor order by module, kind, tensor",
        row_params(phase, rank, step=steps[-1]),
    )
    title = f"fp8 headroom (step {steps[-1]}): the tensors losing most values"
    return title, [(fmt.name, _worst(frame, fmt)) for fmt in formats]


def _worst(frame: pandas.DataFrame, fmt: Format) -> str:
    """The ``TOP`` tensors that lose most in ``fmt``, or ``nothing lost``."""
    numel = frame["numel"].astype("float64").where(frame["numel"] > 0)
    over = frame[fmt.over].astype("float64") / numel
    under = frame[fmt.under].astype("float64") / numel
    if len(frame) and frame["numel"].isna().all():  # files without numel: no fraction known
        return "not known (the run's files lack numel)"
    lost = (over + under).fillna(0.0)
    order = lost.sort_values(ascending=False, kind="stable").index
    shown = [index for index in order[:TOP] if lost[index] > 0]
    if not shown:
        return "nothing lost"
    return ", ".join(_entry(frame.loc[index], over[index], under[index]) for index in shown)


def _entry(row: pandas.Series, over: float, under: float) -> str:
    name = f"{row['module'] or '(root)'} {row['kind']}"
    if row["tensor"] not in _MAIN_TENSORS:
        name += f" {row['tensor']}"
    if over and under:
        return f"{name} {over + under:.1%} ({over:.1%} over, {under:.1%} flushed)"
    return f"{name} {over:.1%} over" if over else f"{name} {under:.1%} flushed"
