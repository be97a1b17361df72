"""``loss_spike``: a sudden jump of the loss, and the layers whose statistics moved first."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._codes import ACTIVATION, FIRST_CALL, GRAD, KIND, SLOT, Codes
from layerscope.health._episodes import Episodes
from layerscope.health._histories import Histories
from layerscope.health._readings import Flush
from layerscope.health._small_ops import take


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
        codes: Codes,
        scalar: str,
        sigmas: float,
        ratio: float,
        window: float,
        warmup: float,
    ) -> None:
        self._codes = codes
        self._scalar = scalar
        self._sigmas = sigmas
        self._ratio = ratio
        self._window = int(window)
        self._warmup = int(warmup)
        self._mean = math.nan
        self._deviation = 0.0
        self._seen = 0
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
