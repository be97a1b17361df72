"""``activation_drift``: an output's scale grown or shrunk by a large factor since the start."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from layerscope.health._readings import ModuleOrder, StepView


class ActivationDrift:
    """The root mean square of each output against its first recorded training step's.

    Options: ``factor`` (100: that many times larger or smaller), ``steps`` (2 recorded steps
    in a row); back within ``sqrt(factor)`` of the start clears it.
    """

    name = "activation_drift"
    defaults: ClassVar[dict[str, Any]] = {"factor": 100.0, "steps": 2}

    def __init__(self, order: ModuleOrder, factor: float, steps: float) -> None:
        self._order = order
        self._factor = factor
        self._episodes = Episodes(patience=int(steps), recovery=int(steps))
        self._start: dict[tuple[str, str], tuple[int, float]] = {}

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel:
            return []
        alerts = []
        for reading in view.first_calls("activation"):
            rms = reading.rms
            if reading.nonfinite or not rms > 0:
                continue
            key = (reading.module, reading.tensor)
            start_step, start = self._start.setdefault(key, (view.step, rms))
            change = rms / start
            holds = change > self._factor or change < 1 / self._factor
            clear = 1 / math.sqrt(self._factor) < change < math.sqrt(self._factor)
            if not self._episodes.observe(key, True if holds else (False if clear else None)):
                continue
            name = reading.module or "the model"
            alerts.append(
                Alert(
                    step=view.step,
                    phase=view.phase,
                    rule=self.name,
                    module=reading.module,
                    kind=reading.kind,
                    tensor=reading.tensor,
                    severity="warning",
                    value=change,
                    threshold=self._factor if change > 1 else 1 / self._factor,
                    message=(
                        f"the output {reading.tensor} of {name} "
                        f"({self._order.type_of(reading.module)}) has "
                        f"{'grown' if change > 1 else 'shrunk'} {max(change, 1 / change):.3g} "
                        f"times in scale since step {start_step} (root mean square {start:.3g} "
                        f"then, {rms:.3g} at step {view.step})"
                    ),
                )
            )
        return alerts
