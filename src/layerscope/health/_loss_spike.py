"""``loss_spike``: a loss that diverges or jumps, and the layers whose statistics moved first."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._codes import ACTIVATION, FIRST_CALL, GRAD, KIND, SLOT, Codes
from layerscope.health._episodes import Episodes
from layerscope.health._histories import Histories
from layerscope.health._loss_levels import RecentLoss, low, noise, since_low
from layerscope.health._readings import Flush
from layerscope.health._small_ops import take


class LossSpike:
    """The scalar ``scalar`` ("loss") climbing away from its recent low, or jumping far above.

    On the log scale, against the last ``window`` values (after ``warmup`` of them): their
    low (the least median of a few in a row, which the fall of the first steps does not
    raise) and their noise (the median absolute deviation of the steps between values). A
    value ``sigmas`` noises above the low is a spike where the loss is diverging (the value
    before was half as far above the low already, this one is the highest since the low and
    ``ratio`` times it) or where it is ``jump`` times the low at once. A jump that falls back
    at the next step is not divergence (a new head, a hard batch). The alert names the layers
    whose scale (root mean square of activations and gradients) left its usual range earliest
    in the ``window`` recorded steps up to the spike. A scalar that is not positive is not
    judged (its window starts again).

    Options: ``scalar`` ("loss"), ``sigmas`` (4), ``ratio`` (1.2), ``jump`` (5),
    ``window`` (20), ``warmup`` (10).
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
        codes: Codes,
        scalar: str,
        sigmas: float,
        ratio: float,
        jump: float,
        window: float,
        warmup: float,
    ) -> None:
        self._codes = codes
        self._scalar = scalar
        self._sigmas = sigmas
        self._ratio = ratio
        self._jump = jump
        self._window = int(window)
        self._warmup = int(warmup)
        self._recent = RecentLoss(self._window)
        self._episodes = Episodes()
        self._scales = Histories()  # by (module, kind, tensor) id

    def observe(self, flush: Flush) -> None:
        """Keep the layers' scales; the alerts come from the scalars."""
        if not len(flush):
            return
        kind = flush.field(KIND)
        # Activations and output gradients: parameter gradients jump from batch to batch.
        rows = (
            (
                flush.judged_rows()
                & ((kind == ACTIVATION) | (kind == GRAD))
                & (flush.field(FIRST_CALL) == 1)
                & (flush.rms > 0)
            )
            .nonzero()
            .flatten()
        )
        self._scales.append(
            take(flush.field(SLOT), rows),
            take(flush.view, rows),
            take(flush.step, rows),
            take(flush.rms, rows),
            len(flush.views),
            len(self._codes.slots.values),
        )

    def observe_scalar(self, step: int, name: str, value: float) -> list[Alert]:
        """Alerts of one scalar."""
        if name != self._scalar or not math.isfinite(value):
            return []  # a non-finite loss is nonfinite's
        logs = self._recent.judged(value, self._warmup)  # the values before this one
        if logs is None:
            return []
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
        """Layers whose scale jumped in the window up to ``step``, earliest first."""
        moved = self._scales.moved(step, self._window)
        # Within a step, as the step computes: the forward pass in its order, then backward.
        moved.sort(key=lambda item: (item[1], self._when(item[0]), item[2]))
        names = self._codes.slots.values
        return [(names[key], at) for key, at, _ in moved]

    def _when(self, key: int) -> tuple[int, int]:
        module, kind, _ = self._codes.slots.values[key]
        place = self._codes.order.forward(module)[1]
        return (0, place) if kind == "activation" else (1, -place)
