"""``vanishing_grad`` and ``exploding_grad``: gradients far too small or too large.

A gradient's scale is its root mean square, so layers of different sizes compare. A layer is
out of bounds relative to the layers after it (nearer the loss, where gradients come from) of
the same kind at that step: ``relative`` times below or above their median (a deep sigmoid
stack's first layers, a badly initialised stack's). A parameter's gradient is also out of
bounds absolutely (``vanishing_below``, ``exploding_above``); an output's is not, as its units
are the loss's as backward saw it: scaled by a GradScaler (65,536 at first) and read before
the scaler unscales, summed or averaged over the batch. Parameter gradients are read where the
optimizer reads them, unscaled. A step with a non-finite gradient is left to the ``nonfinite``
rule (a step GradScaler skipped: its finite gradients are scaled too), and exactly zero
gradients to the ``dead`` rule (no gradient flows through dead units).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, Reading, StepView

_KINDS = {"grad": "output", "weight_grad": "parameter"}
_ABSOLUTE = ("weight_grad",)  # the kinds with absolute bounds: those in the optimizer's units
RECENT = 8  # recorded steps of a layer's output gradient that say what its scale usually is
MIN_HISTORY = 1  # the fewest of them that do
AT_ONCE_HISTORY = 2  # the fewest to judge a jump at once against


class Gradients:
    """Both rules over one step's gradients (``grad`` and ``weight_grad``).

    Options: ``vanishing_below`` (1e-9), ``exploding_above`` (1e3): absolute bounds on
    parameter gradients; ``relative`` (1e3: that many times below or above the median of the
    layers after it); ``steps`` (2 recorded steps in a row).
    """

    name = "gradients"
    rules = ("vanishing_grad", "exploding_grad")
    defaults: ClassVar[dict[str, Any]] = {
        "vanishing_below": 1e-9,
        "exploding_above": 1e3,
        "relative": 1e3,
        "steps": 2,
        "growth": 50.0,
        "climb": 5.0,
    }

    def __init__(
        self,
        order: ModuleOrder,
        vanishing_below: float,
        exploding_above: float,
        relative: float,
        steps: float,
        growth: float = 50.0,
        climb: float = 5.0,
        enabled: tuple[str, ...] = rules,
    ) -> None:
        self._order = order
        self._low = vanishing_below
        self._high = exploding_above
        self._relative = relative
        self._grown_above = growth
        self._climb = climb
        self._steps = int(steps)
        self._enabled = enabled
        self._episodes = {
            rule: Episodes(patience=int(steps), recovery=int(steps)) for rule in enabled
        }
        exploding = "exploding_grad" in enabled
        self._grown = Episodes(patience=int(steps), recovery=int(steps)) if exploding else None
        self._recent: dict[tuple[str, str, str], deque[float]] = {}
        self._rising: dict[int, bool] = {}  # by reading id: above its last recorded scale

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel:
            return []
        if any(r.nonfinite and r.kind in _KINDS for r in view.readings):
            return []
        alerts = []
        for kind in _KINDS:
            kept = [
                r
                for r in view.first_calls(kind)
                if not r.nonfinite and r.rms > 0 and (kind == "grad" or r.tensor == "weight")
            ]
            growth = self._growth(kept) if kind == "grad" else {}
            # A module the call order lacks has no place among the others: judged alone.
            layers = sorted(
                (r for r in kept if self._order.called(r.module)),
                key=lambda r: self._order.forward(r.module),
            )
            # Growth beyond the most any layer after it grew (at least 1).
            most = 0.0
            for reading in reversed(layers):
                grown, held = growth.get(id(reading), (math.nan, 0))
                excess = grown / max(1.0, most)
                growth[id(reading)] = (grown, held, excess)
                most = max(most, 0.0 if math.isnan(grown) else grown)
            # Gradients flow from the loss back: a layer is compared with those after it, whose
            # scales are kept sorted while walking from the last layer to the first.
            after: list[float] = []
            for reading in reversed(layers):
                middles = _middles(after) if len(after) >= 2 else (math.nan, math.nan)
                grown = growth.get(id(reading), (math.nan, 0, math.nan))
                alerts += self._judge(view, reading, reading.rms, middles, len(after), grown)
                bisect.insort(after, reading.rms)
            for reading in kept:
                if not self._order.called(reading.module):
                    grown, held = growth.get(id(reading), (math.nan, 0))[:2]
                    alerts += self._judge(
                        view, reading, reading.rms, (math.nan, math.nan), 0, (grown, held, grown)
                    )
        return alerts

    def _growth(self, readings: list[Reading]) -> dict[int, Any]:
        """Each reading's scale over the median of its last ``RECENT``, and how many; then
        each joins its history."""
        growth = {}
        self._rising.clear()
        for reading in readings:
            recent = self._recent.get((reading.module, reading.kind, reading.tensor), ())
            usual = _median(sorted(recent)) if len(recent) >= MIN_HISTORY else math.nan
            growth[id(reading)] = (reading.rms / usual, len(recent))
            self._rising[id(reading)] = bool(recent) and reading.rms > recent[-1]
        for reading in readings:
            key = (reading.module, reading.kind, reading.tensor)
            self._recent.setdefault(key, deque(maxlen=RECENT)).append(reading.rms)
        return growth

    def _judge(
        self,
        view: StepView,
        reading: Reading,
        rms: float,
        middles: tuple[float, float],
        layers: int,
        grown: tuple[float, int, float],
    ) -> list[Alert]:
        found = self._judge_bounds(view, reading, rms, middles, layers)
        alert = self._judge_growth(view, reading, grown, opened=bool(found))
        return found if alert is None else [*found, alert]

    def _judge_growth(
        self, view: StepView, reading: Reading, grown: tuple[float, int, float], opened: bool
    ) -> Alert | None:
        if self._grown is None or reading.kind != "grad":
            return None
        growth, held, excess = grown
        at_once = excess > self._grown_above and held >= AT_ONCE_HISTORY
        climbing = excess > self._climb and self._rising.get(id(reading), False)
        key = (reading.module, reading.kind, reading.tensor)
        if not self._grown.observe(key, climbing or at_once, at_once) or opened:
            return None
        if key in self._episodes["exploding_grad"].active():
            return None
        name = reading.module or "the model"
        how = (
            f"{excess:.3g} times the most any layer after it grew"
            if at_once
            else f"{excess:.3g} times the most any layer after it grew, beyond {self._climb:g} "
            f"and larger than at the recorded step before, at {self._steps} recorded steps in a "
            "row: a gradient that feeds itself"
        )
        return Alert.on(
            reading,
            rule="exploding_grad",
            value=excess,
            threshold=self._grown_above if at_once else self._climb,
            message=(
                f"exploding gradient at step {view.step}: the gradient of {name} "
                f"({self._order.type_of(reading.module)}) output {reading.tensor} (root "
                f"mean square): its scale {reading.rms:.3g} is {growth:.3g} times its median over "
                f"its last {held} recorded steps, {how}. Output gradients are read before "
                "clipping: look for a loss or a loss weight multiplied up, or a learning rate "
                "too high, and clip gradients"
            ),
        )

    def _judge_bounds(
        self,
        view: StepView,
        reading: Reading,
        rms: float,
        middles: tuple[float, float],
        layers: int,
    ) -> list[Alert]:
        found = []
        compare = layers >= 2  # the layers after it, of which there are ``layers``
        for rule in self._enabled:
            vanishing = rule == "vanishing_grad"
            bound = self._low if vanishing else self._high
            absolute = reading.kind in _ABSOLUTE and (rms < bound if vanishing else rms > bound)
            ratio = rms / middles[0 if vanishing else 1]  # of an even count, nearer its own
            relative = compare and (
                ratio < 1 / self._relative if vanishing else ratio > self._relative
            )
            # Hysteresis: back within a tenth of the way (in orders of magnitude) clears it.
            near = math.log10(self._relative) / 2
            clear = not absolute and abs(math.log10(ratio)) < near if compare else not absolute
            holds = True if absolute or relative else (False if clear else None)
            key = (reading.module, reading.kind, reading.tensor)
            if not self._episodes[rule].observe(key, holds):
                continue
            what = "vanishing" if vanishing else "exploding"
            how = (
                f"its scale {rms:.3g} is {'below' if vanishing else 'above'} {bound:g}"
                if absolute
                else f"its scale {rms:.3g} is {ratio:.2g} times the median of the {layers} "
                "layers after it"
            )
            name = reading.module or "the model"
            found.append(
                Alert.on(
                    reading,
                    rule=rule,
                    value=rms if absolute else ratio,
                    threshold=bound
                    if absolute
                    else (1 / self._relative if vanishing else self._relative),
                    message=(
                        f"{what} gradient at step {view.step}: the gradient of "
                        f"{name} ({self._order.type_of(reading.module)}) "
                        f"{_KINDS[reading.kind]} {reading.tensor} (root mean square): {how}"
                    ),
                )
            )
        return found


def _middles(ordered: list[float]) -> tuple[float, float]:
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle], ordered[middle]
    return ordered[middle - 1], ordered[middle]


def _median(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
