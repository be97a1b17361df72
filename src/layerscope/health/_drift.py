"""``activation_drift``: an output's scale grown or shrunk by a large factor since the start."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from layerscope.health._alert import Alert, Found
from layerscope.health._codes import PAIR, Codes
from layerscope.health._episodes import Episodes
from layerscope.health._keyed import earlier, followed
from layerscope.health._readings import Flush
from layerscope.health._small_ops import put, put_at, take

CLIMB = 4  # recorded steps in a row an output grew at, to be climbing
RISE = 1.5  # how many times its scale at the recorded step before, at each of them


def floored(start: float, base: float) -> str:
    """What a message says of growth measured from ``base``, above the output's ``start``."""
    if not base > start:
        return ""
    return (
        f"; it started near zero, so its growth counts from {base:.3g}, the median start of "
        "the model's outputs"
    )


class ActivationDrift:
    """The root mean square of each output against its start.

    The start is the median over its first ``baseline`` recorded training steps that were not
    skipped: a layer initialised near zero (a classifier's logits) grows fast in its first
    steps, as it should. An output drifts when it is ``factor`` times larger or smaller than
    its start, or when it is ``sqrt(factor)`` times larger and climbing: ``RISE`` times larger
    than at the recorded step before at each of its last ``CLIMB`` recorded steps. Healthy
    growth slows as it goes (a layer waking up, logits that sharpen); a climb that compounds
    step after step is an instability feeding itself, which reaches ``factor`` only later.
    Growth is measured from the larger of its start and the median start of the model's
    outputs (those known at earlier steps): a head initialised at zero starts far below the
    rest, and growing to their scale is learning, not drift.

    Options: ``factor`` (100: that many times larger or smaller), ``steps`` (1 recorded step:
    the next one may be a hundred steps later), ``baseline`` (5); back within
    ``sqrt(factor)`` of the start clears it.
    """

    name = "activation_drift"
    defaults: ClassVar[dict[str, Any]] = {"factor": 100.0, "steps": 1, "baseline": 5}

    def __init__(self, codes: Codes, factor: float, steps: float, baseline: float) -> None:
        self._codes = codes
        self._factor = factor
        self._baseline = max(int(baseline), 1)
        self._episodes = Episodes(patience=int(steps), recovery=int(steps))
        # By (module, tensor) id: the scales seen of the first ``baseline`` steps, the step of
        # the first, and the start (NaN until the baseline is complete).
        self._seen = torch.zeros(0, dtype=torch.int64)
        self._first = torch.zeros((0, self._baseline), dtype=torch.float64)
        self._first_step = torch.zeros(0, dtype=torch.int64)
        self._start = torch.zeros(0, dtype=torch.float64)
        self._done_at = torch.zeros(0, dtype=torch.int64)  # the step each start was complete
        # By (module, tensor) id: its last scale, and the recorded steps in a row up to it at
        # which it grew ``RISE`` times.
        self._last = torch.zeros(0, dtype=torch.float64)
        self._rises = torch.zeros(0, dtype=torch.int64)

    def observe(self, flush: Flush) -> list[Found]:
        """Alerts of a flush's rows: the baselines first, then the rows judged against them."""
        if not len(flush):
            return []
        self._grow(len(self._codes.pairs.values))
        rms = flush.rms
        # A step GradScaler skipped changed no weight: its outputs are the untrained ones of
        # the step before, no start to measure training's drift from.
        skipped = torch.tensor([view.skipped for view in flush.views], dtype=torch.bool)
        at = (flush.finite_outputs() & ~take(skipped, flush.view) & (rms > 0)).nonzero().flatten()
        keys, views, rms = take(flush.field(PAIR), at), take(flush.view, at), take(rms, at)
        seen = take(self._seen, keys) + earlier(views, keys, len(flush.views), len(self._seen))
        self._seen.scatter_add_(0, keys, torch.ones_like(keys))
        founding = seen < self._baseline
        if bool(founding.any()):
            base = founding.nonzero().flatten()
            steps = take(flush.step, at)
            self._found(*(take(column, base) for column in (keys, seen, rms, steps)))
        climbing = self._rose(keys, views, rms) >= CLIMB
        # A row judged against its start: one after its baseline's steps.
        start = take(self._start, keys)
        floors = self._floors(flush)
        grown = rms / torch.fmax(start, take(floors, views))
        out = (grown > self._factor) | (rms / start < 1 / self._factor)
        out |= climbing & (grown > math.sqrt(self._factor))
        size = len(self._seen)
        judged = ~founding
        chosen = judged & followed(keys, judged & out, self._episodes.active(), size)
        picked = chosen.nonzero().flatten()
        found: list[Found] = []
        columns = (views, at, keys, climbing)
        rows = sorted(zip(*(take(c, picked).tolist() for c in columns), strict=True))
        for view, row, key, climbed in rows:
            found += self._judge(flush, view, row, key, climbed, float(floors[view]))
        return found

    def _floors(self, flush: Flush) -> torch.Tensor:
        """By view: the median start of the outputs complete at an earlier step; NaN if none.

        The lower of two middles, as ``torch.median``.
        """
        floors = torch.full((len(flush.views),), math.nan, dtype=torch.float64)
        for index, view in enumerate(flush.views):
            known = self._start[self._done_at < view.step]
            if len(known):
                floors[index] = known.sort().values[(len(known) - 1) // 2]
        return floors

    def _rose(self, keys: torch.Tensor, views: torch.Tensor, rms: torch.Tensor) -> torch.Tensor:
        """By row: the recorded steps in a row, up to its own, its scale grew ``RISE`` times at.

        Each over the recorded step before; each key has one row a view.
        """
        rises = torch.zeros(len(keys), dtype=torch.int64)
        for view in torch.unique(views).tolist():  # oldest first: each is the next one's before
            mine = (views == view).nonzero().flatten()
            key, scale = take(keys, mine), take(rms, mine)
            rose = scale >= RISE * take(self._last, key)  # False against NaN: none before
            count = torch.where(rose, take(self._rises, key) + 1, 0)
            put(self._rises, key, count)
            put(self._last, key, scale)
            put(rises, mine, count)
        return rises

    def _grow(self, size: int) -> None:
        more = size - len(self._seen)
        if more > 0:
            self._seen = torch.cat([self._seen, torch.zeros(more, dtype=torch.int64)])
            blank = torch.full((more, self._baseline), math.nan, dtype=torch.float64)
            self._first = torch.cat([self._first, blank])
            self._first_step = torch.cat([self._first_step, torch.zeros(more, dtype=torch.int64)])
            self._start = torch.cat([self._start, torch.full((more,), math.nan)]).double()
            never = torch.full((more,), torch.iinfo(torch.int64).max, dtype=torch.int64)
            self._done_at = torch.cat([self._done_at, never])
            self._last = torch.cat([self._last, torch.full((more,), math.nan)]).double()
            self._rises = torch.cat([self._rises, torch.zeros(more, dtype=torch.int64)])

    def _found(
        self, keys: torch.Tensor, seen: torch.Tensor, rms: torch.Tensor, steps: torch.Tensor
    ) -> None:
        """Keep the scales of baseline steps; a full baseline's median is its start."""
        put_at(self._first, keys, seen, rms)
        opening = (seen == 0).nonzero().flatten()
        put(self._first_step, take(keys, opening), take(steps, opening))
        completing = (seen == self._baseline - 1).nonzero().flatten()
        full = take(keys, completing)
        put(self._done_at, full, take(steps, completing))
        if len(full):
            ordered = take(self._first, full).sort(dim=1).values
            middle = self._baseline // 2
            median = ordered[:, middle]
            if self._baseline % 2 == 0:
                median = (ordered[:, middle - 1] + median) / 2
            put(self._start, full, median)

    def _judge(
        self, flush: Flush, view: int, row: int, key: int, climbing: bool, floor: float
    ) -> list[Found]:
        reading = flush.reading(row)
        rms = reading.rms
        start, start_step = float(self._start[key]), int(self._first_step[key])
        # Growth counts from the floor too (max(): a NaN floor is none); between the start and
        # the floor an output has not changed.
        base = max(start, floor) if rms > start else start
        change = max(rms / base, 1.0) if rms > start else rms / start
        far = change > self._factor or change < 1 / self._factor
        # A climb is its own confirmation: it held at each of its last CLIMB recorded steps.
        climbed = climbing and change > math.sqrt(self._factor)
        clear = 1 / math.sqrt(self._factor) < change < math.sqrt(self._factor)
        holds = True if far or climbed else (False if clear else None)
        if not self._episodes.observe(key, holds, at_once=climbed):
            return []
        name = reading.module or "the model"
        climb = (
            f", {RISE:g} times or more at each of its last {CLIMB} recorded steps: a growth "
            "that compounds. Look for a loss term that rewards this output's growth (a weight "
            "of the wrong sign), a learning rate too high, or a missing normalisation"
            if climbed and not far
            else ". Look for a change of data or learning rate at the step it began, or "
            "normalise the layer's input"
        )
        alert = Alert.on(
            reading,
            rule=self.name,
            value=change,
            threshold=(
                math.sqrt(self._factor)
                if climbed and not far
                else (self._factor if change > 1 else 1 / self._factor)
            ),
            message=(
                f"the output {reading.tensor} of {name} "
                f"({self._codes.order.type_of(reading.module)}) has "
                f"{'grown' if change > 1 else 'shrunk'} {max(change, 1 / change):.3g} "
                f"times in scale since its first recorded steps (root mean square "
                f"{start:.3g} from step {start_step} on, {rms:.3g} at step "
                f"{flush.views[view].step}{floored(start, base)}){climb}"
            ),
        )
        return [(view, (row,), alert)]
