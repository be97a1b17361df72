"""What the rules read: a flush's rows as columns, and any one row as a ``Reading``.

Rows come from a flush's ``StatsRows`` on the writer thread. The rules judge all of them at
once, with a few tensor operations per flush whatever its steps; only the rows that cross a
threshold, or whose layer is in an episode, become ``Reading`` objects, for the hysteresis and
the message. A module called several times in a step has a row per call; the rules read its
first call's, and any call's non-finite values. A flush holds one row per step and identity.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from layerscope.health._codes import (
    ACTIVATION,
    BUFFER,
    FIELDS,
    FIRST_CALL,
    INPUT,
    KIND,
    PHASE,
    SLOT,
    Codes,
)
from layerscope.health._roots import Roots
from layerscope.health._small_ops import counts_by, put, take
from layerscope.model import StatsRows

# The statistics the rules use; a run that keeps fewer gets fewer alerts, never an error.
USED = ("numel", "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "nan_count", "inf_count")
# Those read as columns (float64, NaN where not kept); ``dead_units`` is the custom statistic
# health.dead_units, where kept.
COLUMNS = ("numel", "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "dead_units")


class Reading:
    """One row: a tensor of a module at a step, and its statistics (NaN where not kept).

    ``rms`` (the root mean square of the finite elements: the tensor's scale, whatever its
    size) and ``nonfinite`` (whether it holds NaN or Inf, where the row can tell) are worked
    out once: every rule asks.
    """

    __slots__ = (
        "call", "kind", "module", "nonfinite", "phase", "rms", "sentinel", "stats", "step",
        "tensor",
    )  # fmt: skip

    def __init__(
        self,
        step: int,
        phase: str,
        module: str,
        kind: str,
        tensor: str,
        call: int,
        sentinel: bool,  # the sentinel's row: only numel, min, max and absmax
        stats: dict[str, float],
    ) -> None:
        self.step = step
        self.phase = phase
        self.module = module
        self.kind = kind
        self.tensor = tensor
        self.call = call
        self.sentinel = sentinel
        self.stats = stats
        numel = stats.get("numel", math.nan)
        self.rms = stats.get("l2", math.nan) / math.sqrt(numel) if numel > 0 else math.nan
        # An input's or a buffer's -inf is an additive attention mask, not a fault: only
        # their NaN counts.
        masks = kind in ("input", "buffer")
        self.nonfinite = _nonfinite(_nan_only(stats) if masks else stats, sentinel)

    def get(self, name: str) -> float:
        """A statistic, NaN where the run does not keep it."""
        return self.stats.get(name, math.nan)


def _nan_only(stats: dict[str, float]) -> dict[str, float]:
    return {name: value for name, value in stats.items() if name != "inf_count"}


def _nonfinite(stats: dict[str, float], sentinel: bool) -> bool:
    nan, inf = stats.get("nan_count"), stats.get("inf_count")
    if nan is not None or inf is not None:
        return (nan or 0) + (inf or 0) > 0
    # The sentinel's extremes are torch.aminmax's: NaN anywhere makes them NaN.
    low, high = stats.get("min", math.nan), stats.get("max", math.nan)
    return (
        sentinel and stats.get("numel", 0) > 0 and not (math.isfinite(low) and math.isfinite(high))
    )


@dataclass(slots=True)
class View:
    """One step and phase of a flush.

    ``sentinel``: all its rows are the sentinel's (an unrecorded step). ``skipped``: the step
    is marked skipped (scalar ``skipped``): the model trained and the optimizer given to
    watch() did not step; the monitor marks it, from the flush's scalars.
    """

    step: int
    phase: str
    sentinel: bool
    skipped: bool = False

    @property
    def judged(self) -> bool:
        """Whether the rules of recorded training steps read it."""
        return self.phase == "train" and not self.sentinel


@dataclass
class Flush:
    """A flush's rows as columns, each ``(rows,)``, and its views (steps and phases).

    Views come oldest step first, training before evaluation; ``view`` gives each row's.
    ``fields`` holds each row's code fields (``Codes.of``); ``stats`` the ``COLUMNS``.
    """

    chunks: list[StatsRows]
    views: list[View]
    step: Tensor
    view: Tensor
    fields: list[Tensor]
    sentinel: Tensor
    nonfinite: Tensor
    rms: Tensor
    stats: dict[str, Tensor]
    _ends: list[int] = field(default_factory=list)
    _judged: Tensor | None = None

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def field(self, name: int) -> Tensor:
        """One field of every row's code (``_codes.PHASE``, ``KIND``, ...)."""
        return self.fields[name]

    def judged_rows(self) -> Tensor:
        """Which rows belong to recorded training steps (``View.judged``)."""
        if self._judged is None:  # every rule asks
            judged = torch.tensor([view.judged for view in self.views], dtype=torch.bool)
            self._judged = take(judged, self.view) if len(self.views) else judged
        return self._judged

    def finite_outputs(self) -> Tensor:
        """Which rows are a module's first call's finite output at a recorded training step.

        The rules on outputs judge these; a non-finite one is the nonfinite rule's.
        """
        return (
            self.judged_rows()
            & (self.field(KIND) == ACTIVATION)
            & (self.field(FIRST_CALL) == 1)
            & ~self.nonfinite
        )

    def per_view(self, rows: Tensor) -> list[int]:
        """How many of the rows marked in ``rows`` each view has."""
        return counts_by(self.view, rows, len(self.views)).tolist()

    def reading(self, row: int) -> Reading:
        """Row ``row``, with its values as Python numbers."""
        chunk_at = bisect.bisect_right(self._ends, row)
        chunk = self.chunks[chunk_at]
        local = row - (self._ends[chunk_at - 1] if chunk_at else 0)
        identity = chunk.identities.identities[int(chunk.identity[local])]
        stats = {name: chunk.stats[name][local].item() for name in USED if name in chunk.stats}
        if "dead_units" in chunk.custom:  # the custom statistic health.dead_units, if kept
            value = chunk.custom["dead_units"][local]
            stats["dead_units"] = math.nan if value is None else value
        return Reading(
            int(chunk.step[local]),
            identity.phase,
            identity.module,
            identity.kind.value,
            identity.tensor,
            identity.call,
            chunk.sentinel,
            stats,
        )


def read_flush(chunks: Sequence[StatsRows], codes: Codes, roots: Roots) -> Flush:
    """The rows of ``chunks`` as columns."""
    kept = [chunk for chunk in chunks if len(chunk)]
    fields = [
        [take(field, chunk.identity) for field in codes.of(chunk.identities)] for chunk in kept
    ]
    step = _cat([chunk.step for chunk in kept], torch.int64)
    stats = {name: _cat([_column(chunk, name) for chunk in kept]) for name in COLUMNS}
    flush = Flush(
        chunks=kept,
        views=[],
        step=step,
        view=torch.zeros_like(step),
        fields=[_cat(list(field), torch.int64) for field in zip(*fields, strict=True)]
        if fields
        else [torch.zeros(0, dtype=torch.int64)] * FIELDS,
        sentinel=_cat([torch.full((len(c),), c.sentinel) for c in kept], torch.bool),
        nonfinite=_cat(
            [_nonfinite_rows(chunk, part) for chunk, part in zip(kept, fields, strict=True)],
            torch.bool,
        ),
        rms=torch.zeros(0),
        stats=stats,
        _ends=[int(end) for end in torch.tensor([len(c) for c in kept]).cumsum(0).tolist()],
    )
    # NaN where numel is not above zero
    flush.rms = stats["l2"] / roots.of(stats["numel"], flush.field(SLOT), len(codes.slots.values))
    if len(flush):
        flush.views, flush.view = _views(flush, codes)
    return flush


def _cat(columns: list[Tensor], dtype: torch.dtype = torch.float64) -> Tensor:
    return torch.cat(columns) if columns else torch.zeros(0, dtype=dtype)


def _column(chunk: StatsRows, name: str) -> Tensor:
    if name in chunk.stats:
        return chunk.stats[name].to(torch.float64)
    if name == "dead_units" and name in chunk.custom:
        values = chunk.custom[name]
        return torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)
    return torch.full((len(chunk),), math.nan, dtype=torch.float64)


def _nonfinite_rows(chunk: StatsRows, fields: list[Tensor]) -> Tensor:
    """``Reading.nonfinite`` of each row of ``chunk``, from its columns."""
    stats = chunk.stats
    rows = len(chunk)
    if chunk.sentinel:  # extremes that are not finite, where the counts are not kept
        numel = stats["numel"] > 0 if "numel" in stats else torch.zeros(rows, dtype=torch.bool)
        low, high = (_column(chunk, name) for name in ("min", "max"))
        extremes = numel & ~(torch.isfinite(low) & torch.isfinite(high))
    else:
        extremes = torch.zeros(rows, dtype=torch.bool)
    nan, inf = stats.get("nan_count"), stats.get("inf_count")
    nans = nan > 0 if nan is not None else None
    counted = extremes
    if nans is not None or inf is not None:
        nothing = torch.zeros(rows, dtype=torch.bool)
        counted = (nans if nans is not None else nothing) | (
            inf > 0 if inf is not None else nothing
        )
    # An input's or a buffer's Inf is a mask: only its NaN count tells.
    kind = fields[KIND]
    masks = (kind == INPUT) | (kind == BUFFER)
    return torch.where(masks, nans if nans is not None else extremes, counted)


def _views(flush: Flush, codes: Codes) -> tuple[list[View], Tensor]:
    """The flush's steps and phases in order, and each row's."""
    phases = len(codes.phases.values)
    first, last = int(flush.step.min()), int(flush.step.max())
    key = (flush.step - first) * phases + flush.field(PHASE)
    span = (last - first + 1) * phases
    if span <= 4 * len(flush) + 1024:  # a lookup table beats a sort
        present = torch.bincount(key, minlength=span).nonzero().flatten()
        lookup = torch.full((span,), -1, dtype=torch.int64)
        put(lookup, present, torch.arange(len(present)))
        view = take(lookup, key)
    else:
        present, view = torch.unique(key, return_inverse=True)
    recorded = counts_by(view, ~flush.sentinel, len(present)).tolist()
    names = codes.phases.values
    views = [
        View(first + at // phases, names[at % phases], sentinel=not recorded[index])
        for index, at in enumerate(present.tolist())
    ]
    return views, view
