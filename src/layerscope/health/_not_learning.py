"""``not_learning``: a loss that has not fallen from where it started."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from layerscope.health._alert import Alert
from layerscope.health._loss_levels import RecentLoss, noise
from layerscope.health._no_signal import NoSignal

# The spread of the median of n normal values is this many standard deviations over sqrt(n).
_MEDIAN_SPREAD = 1.2533
# The values whose step-to-step differences measure the loss's noise.
_NOISE_WINDOW = 20
# A loss this many times its start has diverged: loss_spike's finding, not this one.
_DIVERGED = 2.0


class NotLearning:
    """The scalar ``scalar`` ("loss") no lower, ``steps`` values in, than it started.

    On the log scale: the start is the median of the first ``baseline`` values; the level,
    the median of the last ``window`` values, at its lowest so far. The loss is not learning
    where even the most it fell, plus ``sigmas`` times the noise of those two medians (read
    from the differences of the last values), is less than a fall of ``fall`` (a fraction).
    A loss that fell and then stopped, or climbed back, learned: it is judged against its
    start only. Judged once at the ``steps``-th value, as a note ("info": data with no signal,
    or a run resumed at its plateau, look the same), and once at the ``warning_steps``-th (0:
    never) as a warning. The note is a warning where a classifier's output shows that its
    targets do not follow its inputs (``NoSignal``: at chance, an output that varies from
    sample to sample, its rate not rising). Values that are not finite are nonfinite's; one
    that is not positive ends the judging (no log scale); one ``_DIVERGED`` times the start
    is loss_spike's.

    Options: ``scalar`` ("loss"), ``steps`` (20), ``warning_steps`` (100), ``baseline`` (5),
    ``window`` (7), ``fall`` (0.05), ``sigmas`` (4).
    """

    name = "not_learning"
    defaults: ClassVar[dict[str, Any]] = {
        "scalar": "loss",
        "steps": 20,
        "warning_steps": 100,
        "baseline": 5,
        "window": 7,
        "fall": 0.05,
        "sigmas": 4.0,
    }

    def __init__(
        self,
        scalar: str,
        steps: float,
        warning_steps: float,
        baseline: float,
        window: float,
        fall: float,
        sigmas: float,
    ) -> None:
        self._scalar = scalar
        self._baseline = int(baseline)
        self._window = int(window)
        self._judged_at = {int(steps): "info", int(warning_steps): "warning"}
        self._judged_at.pop(0, None)
        # The value the note is judged at, if any: the output's spread serves it alone.
        self._note_at = next((n for n, level in self._judged_at.items() if level == "info"), None)
        self._fall = -math.log1p(-min(fall, 0.999))  # as a log
        self._sigmas = sigmas
        self._recent = RecentLoss(max(self._window, _NOISE_WINDOW))
        self._start: list[float] = []  # the first logs
        self._first_steps: list[int] = []
        self._level: float | None = None  # the lowest median of ``window`` values in a row
        self._count = 0
        self._done = False
        self._signal = NoSignal()

    def note_rates(self, step: int, rates: Sequence[float]) -> None:
        """The learning rates an optimizer steps with at recorded ``step`` (training thread)."""
        self._signal.note_rates(step, rates)

    def note_output(self, step: int, spread: torch.Tensor, width: int) -> bool:
        """Take the spread of the model's output at recorded ``step`` (training thread).

        Whether later steps' are still wanted: only the note's judgement reads them.
        """
        if self._done or self._note_at is None or self._count >= self._note_at:
            return False
        self._signal.note_output(step, spread, width)
        return True

    def observe_scalar(self, step: int, name: str, value: float) -> list[Alert]:
        """The alert of one scalar, if it is the value the loss is judged at."""
        if self._done or name != self._scalar or not math.isfinite(value):
            return []
        if value <= 0:
            self._done = True
            return []
        self._count += 1
        now = math.log(value)
        self._recent.add(value)
        if len(self._start) < self._baseline:
            self._start.append(now)
            self._first_steps.append(step)
        logs = self._recent.logs
        if len(logs) >= self._window:
            median = statistics.median(logs[-self._window :])
            self._level = median if self._level is None else min(self._level, median)
        severity = self._judged_at.get(self._count)
        if severity is None or self._level is None or len(self._start) < self._baseline:
            return []
        found = self._judge(step, severity, logs)
        if (
            severity == "warning"
            or max(self._judged_at) == self._count
            or (found and found[0].severity == "warning")
        ):
            self._done = True  # nothing later to judge
        return found

    def _judge(self, step: int, severity: str, logs: list[float]) -> list[Alert]:
        assert self._level is not None
        start = statistics.median(self._start)
        fell = start - self._level
        spread = noise(logs[-_NOISE_WINDOW:])
        doubt = (
            self._sigmas
            * _MEDIAN_SPREAD
            * spread
            * math.sqrt(1 / len(self._start) + 1 / self._window)
        )
        recent = statistics.median(logs[-self._window :])
        if fell + doubt >= self._fall or recent - start >= math.log(_DIVERGED):
            return []
        first, last = self._first_steps[0], self._first_steps[-1]
        shown = self._signal.shown(math.exp(start), step) if severity == "info" else None
        told = (
            f"{self._scalar} has not fallen from its start in {self._count} steps: "
            f"{math.exp(recent):.4g} (the median of the last {self._window}), at its lowest "
            f"{math.exp(self._level):.4g}, against {math.exp(start):.4g} at steps {first}-{last}; "
            f"less than the {1 - math.exp(-self._fall):.0%} fall that counts as learning (its "
            f"noise {spread:.1%} a step)"
        )
        labels = "labels belong to their inputs (two samplers, a shuffled or misaligned column)"
        if shown is not None:
            advice = (
                f"; {shown}: check that the {labels} and that the loss reads the output; a "
                "task this model cannot learn at this rate looks the same"
            )
        else:
            # Early on, a model on a plateau before it learns looks the same.
            plateau = "a plateau before the loss starts to fall, " if severity == "info" else ""
            advice = (
                f"; check that the {labels}, that the optimizer holds the trained parameters at "
                f"a rate above 0, and that the loss reads the model's output; {plateau}data "
                "with no signal or a run resumed at its plateau look the same"
            )
        return [
            Alert.of_model(
                step,
                rule=self.name,
                severity=severity if shown is None else "warning",
                value=math.exp(recent),
                threshold=math.exp(start - self._fall),
                message=told + advice,
            )
        ]
