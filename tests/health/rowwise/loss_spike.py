"""``loss_spike``: a sudden jump of the loss, and the layers whose statistics moved first."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, StepView

_MOVED = 3.0  # a layer has moved when its scale is this many times off its usual one
_HISTORY = 64  # recorded steps of each layer's scale kept
_LOOKBACK = 5  # recorded steps before a step that say what its scale usually is
_KINDS = ("activation", "grad")  # parameter gradients jump from batch to batch


class LossSpike:
    """The scalar ``scalar`` ("loss") far above its recent level.

    Its level is a moving mean and mean absolute deviation (weight ``1 / window``) that spikes
    do not move; a value above ``mean + sigmas * deviation`` and ``ratio`` times the mean,
    after ``warmup`` values, is a spike. The alert names the layers whose scale (root mean
    square of activations and gradients) left its usual range earliest in the ``window``
    recorded steps up to the spike.

    Options: ``scalar`` ("loss"), ``sigmas`` (6), ``ratio`` (1.5), ``window`` (20),
    ``warmup`` (10).
    """

    name = "loss_spike"
    defaults: ClassVar[dict[str, Any]] = {
        "scalar": "loss",
        "sigmas": 6.0,
        "ratio": 1.5,
        "window": 20,
        "warmup": 10,
    }

    def __init__(
        self,
        order: ModuleOrder,
        scalar: str,
        sigmas: float,
        ratio: float,
        window: float,
        warmup: float,
    ) -> None:
        self._order = order
        self._scalar = scalar
        self._sigmas = sigmas
        self._ratio = ratio
        self._window = int(window)
        self._warmup = int(warmup)
        self._mean = math.nan
        self._deviation = 0.0
        self._seen = 0
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
        self._seen += 1
        if self._seen == 1:
            self._mean = value
            return []
        level = self._mean
        spread = max(self._deviation, 1e-3 * abs(level))
        spike = (
            self._seen > self._warmup
            and value > level + self._sigmas * spread
            and value > self._ratio * level
        )
        calm = value < level + self._sigmas / 2 * spread
        opened = self._episodes.observe(name, True if spike else (False if calm else None))
        if not spike:  # spikes do not move the level
            weight = 1 / self._window
            self._deviation += weight * (abs(value - level) - self._deviation)
            self._mean += weight * (value - level)
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
                threshold=level + self._sigmas * spread,
                message=(
                    f"{name} spiked at step {step}: {value:.4g}, {value / level:.3g} times its "
                    f"recent level {level:.4g}{cause}"
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
