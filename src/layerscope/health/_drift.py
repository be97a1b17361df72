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


class ActivationDrift:
    """The root mean square of each output against its start.

    The start is the median over its first ``baseline`` recorded training steps that were not
    skipped: a layer initialised near zero (a classifier's logits) grows fast in its first
    steps, as it should.

    Options: ``factor`` (100: that many times larger or smaller), ``steps`` (2 recorded steps
    in a row), ``baseline`` (5); back within ``sqrt(factor)`` of the start clears it.
    """

    name = "activation_drift"
    defaults: ClassVar[dict[str, Any]] = {"factor": 100.0, "steps": 2, "baseline": 5}

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
        # A row judged against its start: one after its baseline's steps.
        change = rms / take(self._start, keys)
        out = (change > self._factor) | (change < 1 / self._factor)
        size = len(self._seen)
        judged = ~founding
        chosen = judged & followed(keys, judged & out, self._episodes.active(), size)
        picked = chosen.nonzero().flatten()
        found: list[Found] = []
        rows = sorted(zip(*(take(c, picked).tolist() for c in (views, at, keys)), strict=True))
        for view, row, key in rows:
            found += self._judge(flush, view, row, key)
        return found

    def _grow(self, size: int) -> None:
        more = size - len(self._seen)
        if more > 0:
            self._seen = torch.cat([self._seen, torch.zeros(more, dtype=torch.int64)])
            blank = torch.full((more, self._baseline), math.nan, dtype=torch.float64)
            self._first = torch.cat([self._first, blank])
            self._first_step = torch.cat([self._first_step, torch.zeros(more, dtype=torch.int64)])
            self._start = torch.cat([self._start, torch.full((more,), math.nan)]).double()

    def _found(
        self, keys: torch.Tensor, seen: torch.Tensor, rms: torch.Tensor, steps: torch.Tensor
    ) -> None:
        """Keep the scales of baseline steps; a full baseline's median is its start."""
        put_at(self._first, keys, seen, rms)
        opening = (seen == 0).nonzero().flatten()
        put(self._first_step, take(keys, opening), take(steps, opening))
        full = take(keys, (seen == self._baseline - 1).nonzero().flatten())
        if len(full):
            ordered = take(self._first, full).sort(dim=1).values
            middle = self._baseline // 2
            median = ordered[:, middle]
            if self._baseline % 2 == 0:
                median = (ordered[:, middle - 1] + median) / 2
            put(self._start, full, median)

    def _judge(self, flush: Flush, view: int, row: int, key: int) -> list[Found]:
        reading = flush.reading(row)
        rms = reading.rms
        start, start_step = float(self._start[key]), int(self._first_step[key])
        change = rms / start
        holds = change > self._factor or change < 1 / self._factor
        clear = 1 / math.sqrt(self._factor) < change < math.sqrt(self._factor)
        if not self._episodes.observe(key, True if holds else (False if clear else None)):
            return []
        name = reading.module or "the model"
        alert = Alert.on(
            reading,
            rule=self.name,
            value=change,
            threshold=self._factor if change > 1 else 1 / self._factor,
            message=(
                f"the output {reading.tensor} of {name} "
                f"({self._codes.order.type_of(reading.module)}) has "
                f"{'grown' if change > 1 else 'shrunk'} {max(change, 1 / change):.3g} "
                f"times in scale since its first recorded steps (root mean square "
                f"{start:.3g} from step {start_step} on, {rms:.3g} at step "
                f"{flush.views[view].step})"
            ),
        )
        return [(view, (row,), alert)]
