"""The loss side of ``loss_spike``: a loss that diverges or jumps, judged from its values.

``LossJudge`` judges each value of the logged loss and words the alerts; which layers moved
first is its subclass's to say, from the rows it keeps (``LossSpike``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from layerscope.health._loss_levels import RecentLoss, low, low_run, noise, since_low

# Layers that moved, earliest first: ((module, kind, tensor), the step it moved at).
Moved = list[tuple[tuple[str, str, str], int]]


@dataclass(frozen=True, slots=True)
class _Pending:
    """A spike whose alert named no layer: no recorded step since the loss's low showed one."""

    step: int
    value: float
    threshold: float
    told: str  # what its alert said of the loss
    since: tuple[int, int]  # the steps of the loss's low


class LossJudge:
    """The loss's values judged for ``loss_spike`` (``LossSpike`` says how)."""

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
        scalar: str,
        sigmas: float,
        ratio: float,
        jump: float,
        window: float,
        warmup: float,
    ) -> None:
        self._scalar = scalar
        self._sigmas = sigmas
        self._ratio = ratio
        self._jump = jump
        self._window = int(window)
        self._warmup = int(warmup)
        self._recent = RecentLoss(self._window)
        self._episodes = Episodes()
        self._pending: _Pending | None = None  # a spike that named no layer, in its window

    def moved_first(self, step: int, since: tuple[int, int]) -> Moved:
        """The layers whose scale moved up to ``step`` (the loss low at ``since``), earliest first.

        A subclass's, from the layers' rows it keeps.
        """
        raise NotImplementedError

    def observe_scalar(self, step: int, name: str, value: float) -> list[Alert]:
        """Alerts of one scalar: a spike, or the layers that moved by a recorded step after one."""
        if name != self._scalar or not math.isfinite(value):
            return []  # a non-finite loss is nonfinite's
        earlier, steps = self._recent.logs, self._recent.steps
        logs = self._recent.judged(value, self._warmup, step)  # the values before this one
        found = [] if logs is None else self._judge(step, name, value, logs, steps)
        if logs is None and value > 0:
            found = self._judge_start(step, name, value, earlier, steps)
        return found or self._follow_up(step)

    def _judge(
        self, step: int, name: str, value: float, logs: list[float], steps: list[int]
    ) -> list[Alert]:
        """A spike against the window's low and noise."""
        level, spread = low(logs), noise(logs)
        rise = math.log(value) - level
        far = rise > self._sigmas * spread
        # Still climbing from the low, the step before already above it: diverging. A jump
        # that then falls back (a new head, a hard batch) is not, unless it is a big one.
        climbing = (
            logs[-1] - level > self._sigmas / 2 * spread
            and math.log(value) >= max(since_low(logs))
            and rise > math.log(self._ratio)
        )
        spike = far and (climbing or rise > math.log(self._jump))
        calm = rise < self._sigmas / 2 * spread
        if not self._episodes.observe(name, True if spike else (False if calm else None)):
            return []
        start, end = low_run(logs)
        told = (
            f"{name} {'climbed' if climbing else 'spiked'} at step {step}: {value:.4g}, "
            f"{math.exp(rise):.3g} times its recent low {math.exp(level):.4g} (the last "
            f"{len(logs)} values; its noise {spread:.1%} a step)"
        )
        threshold = math.exp(level + self._sigmas * spread)
        return self._spiked(step, value, threshold, told, (steps[start], steps[end - 1]))

    def _judge_start(
        self, step: int, name: str, value: float, earlier: list[float], steps: list[int]
    ) -> list[Alert]:
        """Before ``warmup`` values: a loss that runs away from its first ones.

        A loss's first values fall or wobble; rising at each of the last two steps to
        ``jump`` times the least of them, it diverges from the start (a rate far too high).
        """
        if len(earlier) < 3:
            return []
        now = math.log(value)
        least = min(earlier)
        rise = now - least
        running = now > earlier[-1] > earlier[-2] and rise > math.log(self._jump)
        if not running or not self._episodes.observe(name, True):
            return []
        told = (
            f"{name} climbed from its start at step {step}: {value:.4g}, {math.exp(rise):.3g} "
            f"times its least {math.exp(least):.4g} of the {len(earlier)} values before, "
            "rising at each of the last two steps"
        )
        since = steps[earlier.index(least)]
        return self._spiked(
            step, value, math.exp(least + math.log(self._jump)), told, (since, since)
        )

    def _spiked(
        self, step: int, value: float, threshold: float, told: str, since: tuple[int, int]
    ) -> list[Alert]:
        """The alert of a spike at ``step``, the loss low over the steps ``since``."""
        moved = self.moved_first(step, since)
        # No recorded step since the low shows where: the next ones in the window may.
        self._pending = None if moved else _Pending(step, value, threshold, told, since)
        return [self._alert(step, value, threshold, told, moved, since)]

    def _follow_up(self, step: int) -> list[Alert]:
        """Once, the layers that moved by a recorded step after a spike that named none."""
        pending = self._pending
        if pending is None:
            return []
        if step > pending.step + self._window:
            self._pending = None
            return []
        moved = self.moved_first(step, pending.since)
        if not moved:
            return []
        self._pending = None
        at = moved[0][1]  # the recorded step that shows them
        return [
            self._alert(
                at, pending.value, pending.threshold, pending.told, moved, pending.since, True
            )
        ]

    def _alert(
        self,
        step: int,
        value: float,
        threshold: float,
        told: str,
        moved: Moved,
        since: tuple[int, int],
        later: bool = False,
    ) -> Alert:
        """The alert of a spike; ``later``: a second one, at ``step``, where the layers show."""
        first: tuple[str, str, str] = moved[0][0] if moved else ("", "", "")
        named = "; ".join(
            f"{module or 'the model'} {kind} {tensor} (from step {at})"
            for (module, kind, tensor), at in moved[:3]
        )
        low_at = f"step {since[0]}" if since[0] == since[1] else f"steps {since[0]}-{since[1]}"
        when = f"by step {step}, " if later else ""
        cause = (
            f"; {when}the scale moved first in: {named} (3 times off its recent steps' or "
            f"its scale at the loss's low, {low_at})"
            if moved
            else f"; no layer recorded since the loss's low ({low_at}) is 3 times off its scale "
            f"there yet: a step recorded within {self._window} steps of this may show one"
        )
        return Alert(
            step=step,
            phase="train",
            rule=self.name,
            module=first[0],
            kind=first[1],
            tensor=first[2],
            severity="warning",
            value=value,
            threshold=threshold,
            message=(
                f"{told}{cause}; try a lower learning rate, a longer warm-up or gradient "
                "clipping, and look at the layers named first"
            ),
        )
