"""``loss_spike``: the layers whose statistics moved first, read row by row.

The loss's judgement is the library's (``LossJudge``); the layers' scales are kept and read
here row by row.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from layerscope.health._loss_judge import LossJudge, Moved
from rowwise.readings import ModuleOrder, StepView

_MOVED = 3.0  # a layer has moved when its scale is this many times off its usual one
_HISTORY = 64  # recorded steps of each layer's scale kept
_LOOKBACK = 5  # recorded steps before a step that say what its scale usually is
_KINDS = ("activation", "grad")  # parameter gradients jump from batch to batch


class LossSpike(LossJudge):
    """The library's judgement of the loss; the layers that moved, found row by row."""

    def __init__(self, order: ModuleOrder, **options: Any) -> None:
        super().__init__(**options)  # LossJudge's
        self._order = order
        self._scales: dict[tuple[str, str, str], deque[tuple[int, float]]] = {}

    def observe(self, view: StepView) -> list[object]:
        """Keep the layers' scales; the alerts come from the scalars."""
        if view.phase != "train" or view.sentinel:
            return []
        kept = [
            reading
            for reading in view.readings
            if reading.kind in _KINDS and reading.call == 0 and reading.rms > 0
        ]
        for reading in kept:
            key = (reading.module, reading.kind, reading.tensor)
            history = self._scales.setdefault(key, deque(maxlen=_HISTORY))
            history.append((view.step, reading.rms))
        return []

    def moved_first(self, step: int, since: tuple[int, int]) -> Moved:
        """Layers whose scale jumped in the window up to ``step``, or moved from its scale at
        the loss's low (the steps ``since``): each at its earliest, earliest first.

        A jump is a recorded step whose scale is ``_MOVED`` times off the median of the few
        recorded steps before it: a change, not the slow drift of training.
        """
        moved = []
        for key, history in self._scales.items():
            values = list(history)
            found = []
            for i, (at, rms) in enumerate(values):
                if at <= step - self._window or at > step or i < 2:
                    continue
                usual = statistics.median(scale for _, scale in values[max(0, i - _LOOKBACK) : i])
                if max(rms / usual, usual / rms) > _MOVED:
                    found.append((at, -abs(math.log(rms / usual))))
                    break
            at_low = [rms for at, rms in values if since[0] <= at <= since[1]]
            before = [rms for at, rms in values if at < since[0]]
            usual = statistics.median(at_low) if at_low else (before[-1] if before else None)
            for at, rms in values:
                if usual is None or not since[1] < at <= step:
                    continue
                if max(rms / usual, usual / rms) > _MOVED:
                    found.append((at, -abs(math.log(rms / usual))))
                    break
            if found:
                moved.append((key, *min(found)))
        # Within a step, as the step computes: the forward pass in its order, then backward.
        moved.sort(key=lambda item: (item[1], self._when(item[0]), item[2]))
        return [(key, at) for key, at, _ in moved]

    def _when(self, key: tuple[str, str, str]) -> tuple[int, int]:
        module, kind, _ = key
        place = self._order.forward(module)[1]
        return (0, place) if kind == "activation" else (1, -place)
