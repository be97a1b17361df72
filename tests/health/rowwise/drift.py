"""``activation_drift``: an output's scale grown or shrunk by a large factor since the start."""

from __future__ import annotations

import math
import statistics
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._drift import floored
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, StepView

CLIMB = 4  # recorded steps in a row an output grew at, to be climbing
RISE = 1.5  # how many times its scale at the recorded step before, at each of them


class ActivationDrift:
    """The root mean square of each output against its start.

    The start is the median over its first ``baseline`` recorded training steps that were not
    skipped: a layer initialised near zero (a classifier's logits) grows fast in its first
    steps, as it should.

    Options: ``factor`` (100: that many times larger or smaller), ``steps`` (2 recorded steps
    in a row), ``baseline`` (5); back within ``sqrt(factor)`` of the start clears it.
    """

    name = "activation_drift"
    defaults: ClassVar[dict[str, Any]] = {"factor": 100.0, "steps": 1, "baseline": 5}

    def __init__(self, order: ModuleOrder, factor: float, steps: float, baseline: float) -> None:
        self._order = order
        self._factor = factor
        self._baseline = max(int(baseline), 1)
        self._first: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self._episodes = Episodes(patience=int(steps), recovery=int(steps))
        self._start: dict[tuple[str, str], tuple[int, float]] = {}
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # scale, rises in a row

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel or view.skipped:
            return []
        alerts = []
        # Growth counts from at least the median start of the outputs known at earlier steps.
        starts = sorted(start for _, start in self._start.values())
        floor = starts[(len(starts) - 1) // 2] if starts else math.nan
        for reading in view.first_calls("activation"):
            rms = reading.rms
            if reading.nonfinite or not rms > 0:
                continue
            key = (reading.module, reading.tensor)
            last, rises = self._last.get(key, (math.nan, 0))
            rises = rises + 1 if rms >= RISE * last else 0
            self._last[key] = (rms, rises)
            if key not in self._start:
                first = self._first.setdefault(key, [])
                first.append((view.step, rms))
                if len(first) == self._baseline:
                    steps = [step for step, _ in first]
                    self._start[key] = (steps[0], statistics.median(s for _, s in first))
                    del self._first[key]
                continue
            start_step, start = self._start[key]
            base = max(start, floor) if rms > start else start
            change = max(rms / base, 1.0) if rms > start else rms / start
            far = change > self._factor or change < 1 / self._factor
            climbed = rises >= CLIMB and change > math.sqrt(self._factor)
            clear = 1 / math.sqrt(self._factor) < change < math.sqrt(self._factor)
            holds = True if far or climbed else (False if clear else None)
            if not self._episodes.observe(key, holds, at_once=climbed):
                continue
            name = reading.module or "the model"
            climb = (
                f", {RISE:g} times or more at each of its last {CLIMB} recorded steps: a growth "
                "that compounds. Look for a loss term that rewards this output's growth (a weight "
                "of the wrong sign), a learning rate too high, or a missing normalisation"
                if climbed and not far
                else ". Look for a change of data or learning rate at the step it began, or "
                "normalise the layer's input"
            )
            alerts.append(
                Alert.on(
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
                        f"({self._order.type_of(reading.module)}) has "
                        f"{'grown' if change > 1 else 'shrunk'} {max(change, 1 / change):.3g} "
                        f"times in scale since its first recorded steps (root mean square "
                        f"{start:.3g} from step {start_step} on, {rms:.3g} at step "
                        f"{view.step}{floored(start, base)}){climb}"
                    ),
                )
            )
        return alerts
