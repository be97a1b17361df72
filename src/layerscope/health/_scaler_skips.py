"""``scaler_skips``: optimizer steps that GradScaler keeps skipping, and where it overflowed."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._codes import GRAD, KIND, MODULE, WEIGHT_GRAD, Codes
from layerscope.health._readings import Flush

_KEPT = 64  # recorded skipped steps whose first overflowing layer is kept


class ScalerSkips:
    """Steps marked ``skipped`` (GradScaler found an Inf or NaN gradient) that keep coming.

    A GradScaler starts at a high scale (65,536) and halves it at each overflow, skipping
    that step: skips from the first step on, up to ``initial`` of them in a row (16 halvings
    bring 65,536 to 1), find the scale, and are healthy. Later, a skip now and then is the
    scale probing upwards; ``steps`` skips in a row, or ``falls`` skips within ``window``
    steps, mean a gradient overflows at every scale: the scale falls and the model does not
    train. The alert names the layer whose gradient overflowed first in backward order on
    the first recorded step of the run of skips, where one was recorded.

    Options: ``steps`` (3), ``falls`` (5), ``window`` (20), ``initial`` (16).
    """

    name = "scaler_skips"
    defaults: ClassVar[dict[str, Any]] = {"steps": 3, "falls": 5, "window": 20, "initial": 16}

    def __init__(
        self, codes: Codes, steps: float, falls: float, window: float, initial: float
    ) -> None:
        self._codes = codes
        self._steps = int(steps)
        self._falls = int(falls)
        self._window = int(window)
        self._initial = int(initial)
        self._first: int | None = None  # the first step any scalar came for
        self._run: tuple[int, int] | None = None  # the current run of skips: first, last
        self._recent: deque[int] = deque()  # skipped steps after the first run, in the window
        self._open = False  # an episode, until ``window`` steps pass without a skip
        self._overflowed: dict[int, str] = {}  # recorded skipped step: first layer to overflow

    def observe(self, flush: Flush) -> None:
        """Keep, for each recorded skipped step, the layer whose gradient overflowed first."""
        skipped = {index for index, view in enumerate(flush.views) if view.skipped and view.judged}
        if not skipped or not len(flush):
            return
        kind = flush.field(KIND)
        rows = (flush.nonfinite & ((kind == GRAD) | (kind == WEIGHT_GRAD))).nonzero().flatten()
        first: dict[int, tuple[tuple[int, int], str]] = {}
        names = self._codes.modules.values
        for row in rows.tolist():
            view = int(flush.view[row])
            if view not in skipped:
                continue
            module = names[int(flush.field(MODULE)[row])]
            # Backward computes the last layer's output gradient first, then its weights'.
            place = self._codes.order.forward(module)[1]
            when = (-place, 0 if int(kind[row]) == GRAD else 1)
            step = flush.views[view].step
            if step not in first or when < first[step][0]:
                first[step] = (when, module)
        for step, (_, module) in first.items():
            self._overflowed[step] = module
        while len(self._overflowed) > _KEPT:
            del self._overflowed[min(self._overflowed)]

    def observe_scalars(self, scalars: Sequence[tuple[int, str, float]]) -> list[Alert]:
        """Alerts of a flush's scalars: its skipped marks, its steps."""
        if scalars and self._first is None:
            self._first = min(step for step, _, _ in scalars)
        alerts = []
        for step, name, value in scalars:
            if name == "skipped" and value:
                alerts += self._skipped(step)
        return alerts

    def _skipped(self, step: int) -> list[Alert]:
        if self._run is not None and self._run[1] == step - 1:
            self._run = (self._run[0], step)
        else:
            self._run = (step, step)
        start = self._run[0]
        in_row = step - start + 1
        if start == self._first:  # the scale is still being found
            if in_row < self._initial:
                return []
            return self._alert(step, in_row, "in a row from the first step", self._initial)
        recent = self._recent
        if recent and step - recent[-1] >= self._window:
            self._open = False  # a window without a skip ends the episode
        recent.append(step)
        while recent[0] <= step - self._window:
            recent.popleft()
        if in_row >= self._steps:
            return self._alert(step, in_row, "in a row", self._steps)
        if len(recent) >= self._falls:
            return self._alert(step, len(recent), f"in the last {self._window} steps", self._falls)
        return []

    def _alert(self, step: int, count: int, how: str, limit: int) -> list[Alert]:
        if self._open:
            return []
        self._open = True
        assert self._run is not None
        recorded = [at for at in self._overflowed if self._run[0] <= at <= step]
        module = self._overflowed[min(recorded)] if recorded else ""
        where = (
            f"; on recorded step {min(recorded)} the gradient of {module} overflowed first"
            if recorded
            else ""
        )
        return [
            Alert(
                step=step,
                phase="train",
                rule=self.name,
                module=module,
                kind="grad" if module else "",
                tensor="",
                severity="warning",
                value=float(count),
                threshold=float(limit),
                message=(
                    f"{count} optimizer steps skipped {how} by step {step} (a healthy "
                    f"GradScaler skips fewer than {limit}): GradScaler skips a step whose "
                    f"gradients hold an Inf or NaN, halves its scale and leaves the weights "
                    f"as they were{where}; look for a NaN or Inf made in backward (a square "
                    "root or a division at zero, a log of 0), or run that layer in float32"
                ),
            )
        ]
