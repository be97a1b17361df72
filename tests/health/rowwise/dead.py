"""``dead``: outputs that stay exactly zero, wholly or unit by unit: dying ReLUs."""

from __future__ import annotations

from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._dead import RECTIFIERS, SURE_NUMEL, SURE_STEPS
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, Reading, StepView

_ADVICE = (
    "a too high learning rate, a large negative bias or a poor initialisation kills ReLU units"
)
# Modules that only reshape or pass on their input: zeros there are the layer before's, which
# has its own alert.
PASS_THROUGH = frozenset(
    ("Flatten", "Unflatten", "Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
     "AlphaDropout", "FeatureAlphaDropout")
)  # fmt: skip


class Dead:
    """Outputs that are mostly zero, or have many units that are zero for the whole batch.

    That is, a zero fraction of at least ``threshold``, or, where the custom statistic
    ``health.dead_units`` is kept, at least ``units`` of the units dead; either for ``steps``
    recorded training steps in a row. An episode ends when the measure falls below
    ``clear_below`` times its threshold. Modules that only pass their input on (Flatten,
    Dropout, ...) are left out: their zeros are the alert of the layer before.

    Options: ``threshold`` (0.99), ``units`` (0.5), ``steps`` (3), ``clear_below`` (0.9).
    """

    name = "dead"
    defaults: ClassVar[dict[str, Any]] = {
        "threshold": 0.99,
        "units": 0.5,
        "steps": 3,
        "clear_below": 0.9,
    }

    def __init__(
        self, order: ModuleOrder, threshold: float, units: float, steps: float, clear_below: float
    ) -> None:
        self._order = order
        self._limits = {"zero_frac": threshold, "dead_units": units}
        self._steps = int(steps)
        self._clear_below = clear_below
        self._episodes = Episodes(patience=self._steps)
        self._wholly_zero: dict[tuple[str, str, str], int] = {}

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel:
            return []
        alerts = []
        for reading in view.first_calls("activation"):
            if reading.nonfinite:  # the nonfinite rule's
                continue
            if self._order.type_of(reading.module) in PASS_THROUGH:
                continue
            for measure, limit in self._limits.items():
                value = reading.get(measure)
                if value != value:  # not kept
                    continue
                holds = True if value >= limit else None
                if value < limit * self._clear_below:
                    holds = False
                key = (reading.module, reading.tensor, measure)
                wholly_zero = (
                    measure == "zero_frac"
                    and value >= 1.0
                    and reading.get("numel") >= SURE_NUMEL
                    and self._order.type_of(reading.module) in RECTIFIERS
                )
                in_a_row = self._wholly_zero.pop(key, 0) + 1 if wholly_zero else 0
                if in_a_row:
                    self._wholly_zero[key] = in_a_row
                sure = in_a_row >= min(SURE_STEPS, self._steps)
                if self._episodes.observe(key, holds, at_once=sure):
                    steps = in_a_row if sure else self._steps
                    alerts.append(self._alert(view, reading, measure, value, limit, steps))
        return alerts

    def _alert(
        self,
        view: StepView,
        reading: Reading,
        measure: str,
        value: float,
        limit: float,
        steps: int,
    ) -> Alert:
        name = f"{reading.module or 'the model'} ({self._order.type_of(reading.module)})"
        if measure == "zero_frac":
            what = f"{value:.1%} of its output {reading.tensor} is exactly zero"
        else:
            what = (
                f"{value:.1%} of the units of its output {reading.tensor} are zero for the "
                "whole batch"
            )
        return Alert.on(
            reading,
            rule=self.name,
            value=value,
            threshold=limit,
            message=(
                f"{name} is dying: {what}, {steps} recorded steps in a row up to step "
                f"{view.step}; {_ADVICE}"
            ),
        )
