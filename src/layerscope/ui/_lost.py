"""The fraction of a tensor's values each low-precision format would lose, as a chart statistic.

``e4m3_lost``, ``e5m2_lost``, ``fp16_lost`` and ``bf16_lost`` are derived in SQL from the
run's counts: ``({fmt}_over + {fmt}_under) / numel``, the values that would overflow or flush
to zero (``layerscope.stats.FORMATS``). The heat map and a layer's series offer them beside
the stored statistics wherever the run holds the counts; a bucket of steps shows its largest.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerscope.model import quote_identifier
from layerscope.plots import check_stat
from layerscope.stats import FORMATS
from layerscope.store import Run

#: Each derived statistic and the format it measures.
LOST_STATS = {f"{fmt.name}_lost": fmt for fmt in FORMATS}


def lost_stats(recorded: Sequence[str]) -> list[str]:
    """The derived statistics a run with the statistics ``recorded`` can give."""
    return [
        name for name, fmt in LOST_STATS.items() if fmt.over in recorded and fmt.under in recorded
    ]


def expression(name: str) -> str:
    """The SQL of statistic ``name``: its column, or a derived one's formula.

    Examples:
        >>> expression("absmax")
        '"absmax"'
        >>> expression("e4m3_lost")
        '(("e4m3_over" + "e4m3_under")::double / nullif("numel", 0))'
    """
    fmt = LOST_STATS.get(name)
    if fmt is None:
        return quote_identifier(name)
    over, under, numel = map(quote_identifier, (fmt.over, fmt.under, "numel"))
    return f"(({over} + {under})::double / nullif({numel}, 0))"


def check_chart_stat(run: Run, stat: str) -> str:
    """``stat`` if the run recorded it or can derive it, else a ValueError naming ``stat``."""
    if stat in lost_stats(run.meta.get("config", {}).get("stats", ())):
        return stat
    return check_stat(run, stat)
