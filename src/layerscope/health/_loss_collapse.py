"""``loss_collapse``: a loss that falls far below its recent level at once."""

from __future__ import annotations

import math
import statistics
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._loss_levels import RecentLoss, noise

# The recent level is the median of this many values before: it follows a healthy fall.
RECENT = 7


class LossCollapse:
    """The scalar ``scalar`` ("loss") ``factor`` times below its recent level at once.

    On the log scale, against the last ``window`` values (after ``warmup`` of them): a value
    that is the lowest of the window, ``factor`` times below the median of the ``RECENT``
    values before it and ``sigmas`` noises (the median absolute deviation of the steps
    between values) below it. Training lowers a loss by a few percent a step; a loss that
    drops five times in a step or two has found a shortcut: labels that became one class or
    leaked into the inputs, a mask that lets the model see its target, a loss that no longer
    reads the batch. The episode lasts until the loss is back within ``sqrt(factor)`` of the
    level it fell from.

    Options: ``scalar`` ("loss"), ``factor`` (5), ``sigmas`` (8), ``window`` (20),
    ``warmup`` (10).
    """

    name = "loss_collapse"
    defaults: ClassVar[dict[str, Any]] = {
        "scalar": "loss",
        "factor": 5.0,
        "sigmas": 8.0,
        "window": 20,
        "warmup": 10,
    }

    def __init__(
        self, scalar: str, factor: float, sigmas: float, window: float, warmup: float
    ) -> None:
        self._scalar = scalar
        self._drop = math.log(max(factor, 1.0))
        self._sigmas = sigmas
        self._warmup = int(warmup)
        self._recent = RecentLoss(int(window))
        self._fell_from: float | None = None  # the level of the open episode, as a log

    def observe_scalar(self, step: int, name: str, value: float) -> list[Alert]:
        """Alerts of one scalar."""
        if name != self._scalar or not math.isfinite(value):
            return []  # a non-finite loss is nonfinite's
        logs = self._recent.judged(value, self._warmup)  # the values before this one
        if logs is None:
            return []
        now = math.log(value)
        if self._fell_from is not None:
            if now > self._fell_from - self._drop / 2:
                self._fell_from = None  # recovered: a later collapse is a new episode
            return []
        level, spread = statistics.median(logs[-RECENT:]), noise(logs)
        fall = level - now
        if now > min(logs) or fall <= max(self._drop, self._sigmas * spread):
            return []
        self._fell_from = level
        return [
            Alert.of_model(
                step,
                rule=self.name,
                severity="warning",
                value=value,
                threshold=math.exp(level - max(self._drop, self._sigmas * spread)),
                message=(
                    f"{name} collapsed at step {step}: {value:.4g}, {math.exp(fall):.3g} times "
                    f"below its level of the {len(logs[-RECENT:])} steps before "
                    f"({math.exp(level):.4g}; its noise {spread:.1%} a step); a loss does not "
                    "fall that fast by learning: check the labels (all one class?), that no "
                    "input holds the target (a mask, a shifted sequence), and that the loss "
                    "still reads the batch"
                ),
            )
        ]
