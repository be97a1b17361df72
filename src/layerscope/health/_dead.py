"""``dead``: outputs that stay exactly zero: dying ReLUs."""

from __future__ import annotations

from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from layerscope.health._readings import ModuleOrder, StepView


class Dead:
    """Outputs whose zero fraction stays at least ``threshold``.

    For ``steps`` recorded training steps in a row; the episode ends when it falls below
    ``clear_below``.

    Options: ``threshold`` (0.99), ``steps`` (3), ``clear_below`` (0.9).
    """

    name = "dead"
    defaults: ClassVar[dict[str, Any]] = {"threshold": 0.99, "steps": 3, "clear_below": 0.9}

    def __init__(
        self, order: ModuleOrder, threshold: float, steps: float, clear_below: float
    ) -> None:
        self._order = order
        self._threshold = threshold
        self._steps = int(steps)
        self._clear_below = clear_below
        self._episodes = Episodes(patience=self._steps)

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel:
            return []
        alerts = []
        for reading in view.first_calls("activation"):
            zeros = reading.get("zero_frac")
            if zeros != zeros or reading.nonfinite:  # not kept, or the nonfinite rule's
                continue
            holds = True if zeros >= self._threshold else None
            if zeros < self._clear_below:
                holds = False
            if self._episodes.observe((reading.module, reading.tensor), holds):
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
                        value=zeros,
                        threshold=self._threshold,
                        message=(
                            f"{name} ({self._order.type_of(reading.module)}) is dying: "
                            f"{zeros:.1%} of its output {reading.tensor} is exactly zero, "
                            f"{self._steps} recorded steps in a row up to step {view.step}; "
                            "a too high learning rate, a large negative bias or a poor "
                            "initialisation kills ReLU units"
                        ),
                    )
                )
        return alerts
