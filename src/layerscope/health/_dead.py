"""``dead``: outputs that stay exactly zero, wholly or unit by unit: dying ReLUs."""

from __future__ import annotations

from typing import Any, ClassVar

from layerscope.health._alert import Alert, Found
from layerscope.health._codes import MODULE, PAIR, Codes
from layerscope.health._episodes import Episodes
from layerscope.health._keyed import followed
from layerscope.health._readings import Flush, Reading
from layerscope.health._small_ops import take

_ADVICE = (
    "a too high learning rate, a large negative bias or a poor initialisation kills ReLU units"
)
_MEASURES = ("zero_frac", "dead_units")
# Rectifiers: where their whole output is zero, so is every gradient through them, and nothing
# revives the layer before. Other modules output zeros by design: a zero-initialised layer
# (moved by its first updates, or its first after a warm-up from a rate of 0), a mask.
RECTIFIERS = frozenset(("ReLU", "ReLU6"))
# The values an output holds, at least, for all of them zero to be no chance of one batch.
SURE_NUMEL = 256
# Recorded steps in a row a rectifier's output takes, wholly zero, to be reported dead.
SURE_STEPS = 2


class Dead:
    """Outputs that are mostly zero, or have many units that are zero for the whole batch.

    That is, a zero fraction of at least ``threshold``, or, where the custom statistic
    ``health.dead_units`` is kept, at least ``units`` of the units dead; either for ``steps``
    recorded training steps in a row. A rectifier (``RECTIFIERS``) whose whole output, of at
    least ``SURE_NUMEL`` values, is exactly zero is past doubt: no gradient passes it to
    revive the layer before, so ``SURE_STEPS`` recorded steps in a row are enough where
    ``steps`` asks more. An episode ends when the measure falls below ``clear_below`` times its
    threshold. Modules that only pass their input on (Flatten, Dropout, ...) are left out:
    their zeros are the alert of the layer before.

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
        self, codes: Codes, threshold: float, units: float, steps: float, clear_below: float
    ) -> None:
        self._codes = codes
        self._limits = (threshold, units)
        self._steps = int(steps)
        self._clear_below = clear_below
        # Keyed by (module, tensor) id times 2 plus the measure's index.
        self._episodes = Episodes(patience=self._steps)
        # By key: recorded steps in a row that the output was a rectifier's, wholly zero.
        self._wholly_zero: dict[int, int] = {}

    def observe(self, flush: Flush) -> list[Found]:
        """Alerts of a flush's rows: those at or above a limit, and those of open episodes."""
        if not len(flush):
            return []
        rows = flush.finite_outputs() & ~take(self._codes.passing(), flush.field(MODULE))
        active = self._episodes.active()
        pairs = flush.field(PAIR)
        judged: list[tuple[int, int, int]] = []  # (view, row, measure)
        for measure, (name, limit) in enumerate(zip(_MEASURES, self._limits, strict=True)):
            value = flush.stats[name]
            keys = pairs * 2 + measure
            size = 2 * len(self._codes.pairs.values)
            holds = rows & (value >= limit)
            chosen = rows & followed(keys, holds, active, size) & ~value.isnan()
            at = chosen.nonzero().flatten()
            for view, row in zip(take(flush.view, at).tolist(), at.tolist(), strict=True):
                judged.append((view, row, measure))
        found: list[Found] = []
        for view, row, measure in sorted(judged):
            found += self._judge(flush, view, row, measure, int(pairs[row]) * 2 + measure)
        return found

    def _judge(self, flush: Flush, view: int, row: int, measure: int, key: int) -> list[Found]:
        value = float(flush.stats[_MEASURES[measure]][row])
        limit = self._limits[measure]
        holds = True if value >= limit else None
        if value < limit * self._clear_below:
            holds = False
        in_a_row = self._wholly_zero.pop(key, 0) + 1 if self._sure(flush, row, measure) else 0
        if in_a_row:
            self._wholly_zero[key] = in_a_row
        sure = in_a_row >= min(SURE_STEPS, self._steps)
        if not self._episodes.observe(key, holds, at_once=sure):
            return []
        reading = flush.reading(row)
        steps = in_a_row if sure else self._steps
        alert = self._alert(
            flush.views[view].step, reading, _MEASURES[measure], value, limit, steps
        )
        return [(view, (row, measure), alert)]

    def _sure(self, flush: Flush, row: int, measure: int) -> bool:
        """Whether the row is a rectifier's output of ``SURE_NUMEL`` values or more, all zero."""
        if _MEASURES[measure] != "zero_frac" or float(flush.stats["zero_frac"][row]) < 1.0:
            return False
        if float(flush.stats["numel"][row]) < SURE_NUMEL:
            return False
        module = self._codes.modules.values[int(flush.field(MODULE)[row])]
        return self._codes.order.type_of(module) in RECTIFIERS

    def _alert(
        self, step: int, reading: Reading, measure: str, value: float, limit: float, steps: int
    ) -> Alert:
        name = f"{reading.module or 'the model'} ({self._codes.order.type_of(reading.module)})"
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
                f"{step}; {_ADVICE}"
            ),
        )
