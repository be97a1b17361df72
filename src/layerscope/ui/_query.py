"""Which rows a chart reads, and how many steps make one of its columns.

A chart reads the rows the matplotlib figures read (call 0, no sentinel rows, one kind, tensor
and phase), of the rank the page chose. Over many steps, it reads them downsampled in SQL:
steps are cut into buckets of ``width`` consecutive steps, so at most ``max_columns`` columns
come back, and each statistic is aggregated as fits it (the largest ``absmax`` of a bucket, so a
spike is never averaged away; the smallest ``min``; the mean of a mean). Every response says
the width and the aggregate it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerscope.plots import (
    DEFAULT_TENSOR,
    check_kind,
    check_phase,
    select_modules,
)
from layerscope.store import Run
from layerscope.ui._lost import LOST_STATS

# Columns of a chart over steps: about one per pixel of a wide screen.
MAX_COLUMNS = 1000
# How a bucket of steps aggregates a statistic; the mean for any other (custom ones too).
_AGGREGATES = {
    "absmax": "max",
    "max": "max",
    "nan_count": "max",
    "inf_count": "max",
    "numel": "max",
    "min": "min",
    **dict.fromkeys(LOST_STATS, "max"),  # the fraction lost: a bucket shows its worst step
}


def aggregate(stat: str) -> str:
    """The SQL aggregate that keeps what matters of ``stat`` over a bucket of steps."""
    return _AGGREGATES.get(stat, "avg")


@dataclass(frozen=True, slots=True)
class Selection:
    """One kind, tensor, phase and rank of a run: the rows of one chart.

    Raises:
        ValueError: for an unknown kind or phase, naming it.
    """

    kind: str
    tensor: str
    phase: str
    rank: int

    @classmethod
    def checked(cls, kind: str, tensor: str | None, phase: str, rank: int) -> Selection:
        """A selection of valid values; ``tensor`` None is the kind's default tensor."""
        kind = check_kind(kind)
        tensor = DEFAULT_TENSOR[kind] if tensor is None or tensor == "" else tensor
        return cls(kind, tensor, check_phase(phase), int(rank))

    def where(self) -> str:
        """The SQL condition of its rows, with the parameters ``params`` gives."""
        return (
            "kind = $kind and tensor = $tensor and phase = $phase and rank = $rank"
            # As the figures' coalesce(call, 0) = 0 and not coalesce(sentinel, false), in a
            # form DuckDB filters faster (zone maps of call, no function per row).
            " and (call = 0 or call is null) and sentinel is not true"
        )

    def params(self, **more: object) -> dict[str, object]:
        """The values of ``where``'s parameters, and ``more``."""
        return {
            "kind": self.kind,
            "tensor": self.tensor,
            "phase": self.phase,
            "rank": self.rank,
            **more,
        }


def bucket_width(run: Run, steps: int | None, max_columns: int = MAX_COLUMNS) -> int:
    """Steps per column so that the run's ``steps`` fit in ``max_columns`` columns.

    Args:
        run: the run (its ``meta["steps"]`` is used where ``steps`` is None).
        steps: how many steps the run has made, from a fresh ``run.json``.
        max_columns: the most columns wanted.
    """
    if steps is None:
        steps = run.meta.get("steps") or 0
    if max_columns < 1:
        raise ValueError(f"columns: expected at least 1, got {max_columns}")
    return max(1, math.ceil(int(steps) / max_columns))


def check_module(run: Run, module: str) -> str:
    """``module`` if it is a module of the run, else a ValueError naming ``module``."""
    return select_modules(run, [module])[0]
