"""``loss_spike``: a sudden jump of the loss, and the layers whose statistics moved first."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from layerscope.health._loss_levels import RecentLoss, low, noise, since_low
from rowwise.readings import ModuleOrder, StepView

_MOVED = 3.0  # a layer has moved when its scale is this many times off its usual one
_HISTORY = 64  # recorded steps of each layer's scale kept
_LOOKBACK = 5  # recorded steps before a step that say what its scale usually is
_KINDS = ("activation", "grad")  # parameter gradients jump from batch to batch


class LossSpike:
    """The scalar ``scalar`` ("loss") climbing away from its recent low, or jumping far above.

    The scalar's judgement is the library's (``_loss_levels``); the layers' scales are kept and
    read here row by row.
    """

    name = "loss_spike"
    defaults: ClassVar[dict[str, Any]] = {
        "scalar": "loss",
        "sigmas": 4.0,
        "ratio": 1.2,
        "jump": 5.0,
        "window": 20,
        "warmup": 10,
    }

    def __init__(
        self,
        order: ModuleOrder,
        scalar: str,
        sigmas: float,
        ratio: float,
        jump: float,
        window: float,
        warmup: float,
    ) -> None:
        self._order = order
        self._scalar = scalar
        self._sigmas = sigmas
        self._ratio = ratio
        self._jump = jump
        self._window = int(window)
        self._warmup = int(warmup)
        self._recent = RecentLoss(self._window)
        self._episodes = Episodes()
        self._scales: dict[tuple[str, str, str], deque[tuple[int, float]]] = {}

    def observe(self, view: StepView) -> list[Alert]:
        """Keep the layers' scales; the alerts come from the scalars."""
        if view.phase != "train" or view.sentinel:
            return []
        for reading in view.readings:
            if reading.kind in _KINDS and reading.call == 0 and reading.rms > 0:
                key = (reading.module, reading.kind, reading.tensor)
                history = self._scales.setdefault(key, deque(maxlen=_HISTORY))
                history.append((view.step, reading.rms))
        return []

    def observe_scalar(self, step: int, name: str, value: float) -> list[Alert]:
        """Alerts of one scalar."""
        if name != self._scalar or not math.isfinite(value):
            return []
        logs = self._recent.logs
        self._recent.add(value)
        if len(logs) < max(self._warmup, 2) or value <= 0:
            return []
        level, spread = low(logs), noise(logs)
        rise = math.log(value) - level
        climbing = (
            logs[-1] - level > self._sigmas / 2 * spread
            and math.log(value) >= max(since_low(logs))
            and rise > math.log(self._ratio)
        )
        spike = rise > self._sigmas * spread and (climbing or rise > math.log(self._jump))
        calm = rise < self._sigmas / 2 * spread
        opened = self._episodes.observe(name, True if spike else (False if calm else None))
        if not opened:
            return []
        moved = self._moved_first(step)
        first: tuple[str, str, str] = moved[0][0] if moved else ("", "", "")
        named = "; ".join(
            f"{module or 'the model'} {kind} {tensor} (from step {at})"
            for (module, kind, tensor), at in moved[:3]
        )
        cause = f"; the scale moved first in: {named}" if moved else ""
        return [
            Alert(
                step=step,
                phase="train",
                rule=self.name,
                module=first[0],
                kind=first[1],
                tensor=first[2],
                severity="warning",
                value=value,
                threshold=math.exp(level + self._sigmas * spread),
                message=(
                    f"{name} {'climbed' if climbing else 'spiked'} at step {step}: "
                    f"{value:.4g}, {math.exp(rise):.3g} times its recent low "
                    f"{math.exp(level):.4g} (the last {len(logs)} values; its noise "
                    f"{spread:.1%} a step){cause}; try a lower learning rate, a longer "
                    "warm-up or gradient clipping, and look at the layers named first"
                ),
            )
        ]

    def _moved_first(self, step: int) -> list[tuple[tuple[str, str, str], int]]:
        """Layers whose scale jumped in the window up to ``step``, earliest first.

        A jump is a recorded step whose scale is ``_MOVED`` times off the median of the few
        recorded steps before it: a change, not the slow drift of training.
        """
        moved = []
        for key, history in self._scales.items():
            values = list(history)
            for i, (at, rms) in enumerate(values):
                if at <= step - self._window or at > step or i < 2:
                    continue
                usual = statistics.median(scale for _, scale in values[max(0, i - _LOOKBACK) : i])
                if max(rms / usual, usual / rms) > _MOVED:
                    moved.append((key, at, -abs(math.log(rms / usual))))
                    break
        # Within a step, as the step computes: the forward pass in its order, then backward.
        moved.sort(key=lambda item: (item[1], self._when(item[0]), item[2]))
        return [(key, at) for key, at, _ in moved]

    def _when(self, key: tuple[str, str, str]) -> tuple[int, int]:
        module, kind, _ = key
        place = self._order.forward(module)[1]
        return (0, place) if kind == "activation" else (1, -place)
