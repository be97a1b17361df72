"""``activation_drift``: an output's scale grown or shrunk by a large factor since the start."""

from __future__ import annotations

import math
import statistics
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, StepView


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

    def __init__(self, order: ModuleOrder, factor: float, steps: float, baseline: float) -> None:
        self._order = order
        self._factor = factor
        self._baseline = max(int(baseline), 1)
        self._first: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self._episodes = Episodes(patience=int(steps), recovery=int(steps))
        self._start: dict[tuple[str, str], tuple[int, float]] = {}

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel or view.skipped:
            return []
        alerts = []
        for reading in view.first_calls("activation"):
            rms = reading.rms
            if reading.nonfinite or not rms > 0:
                continue
            key = (reading.module, reading.tensor)
            if key not in self._start:
                first = self._first.setdefault(key, [])
                first.append((view.step, rms))
                if len(first) == self._baseline:
                    steps = [step for step, _ in first]
                    self._start[key] = (steps[0], statistics.median(s for _, s in first))
                    del self._first[key]
                continue
            start_step, start = self._start[key]
            change = rms / start
            holds = change > self._factor or change < 1 / self._factor
            clear = 1 / math.sqrt(self._factor) < change < math.sqrt(self._factor)
            if not self._episodes.observe(key, True if holds else (False if clear else None)):
                continue
            name = reading.module or "the model"
            alerts.append(
                Alert.on(
                    reading,
                    rule=self.name,
                    value=change,
                    threshold=self._factor if change > 1 else 1 / self._factor,
                    message=(
                        f"the output {reading.tensor} of {name} "
                        f"({self._order.type_of(reading.module)}) has "
                        f"{'grown' if change > 1 else 'shrunk'} {max(change, 1 / change):.3g} "
                        f"times in scale since its first recorded steps (root mean square "
                        f"{start:.3g} from step {start_step} on, {rms:.3g} at step {view.step})"
                    ),
                )
            )
        return alerts
