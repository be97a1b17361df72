"""``update_ratio``: how much an optimizer step changes each parameter, against its size.

||update|| / ||weight|| near 1e-3 is the rule of thumb for a healthy learning rate. Far below
(``low``), the parameter barely learns; exactly zero, it never changes: it is missing from the
optimizer's parameter groups, or frozen by a zero learning rate. Far above (``high``), the
step is too large. With ``kinds`` including ``"update"`` the ratio is measured; without, a
parameter left out of the optimizer given to ``watch`` has a ratio of exactly zero, and with
no optimizer given, one whose statistics are bit for bit the same at two recorded steps while
a clearly visible gradient flowed and other parameters changed.

A ratio is judged only where an update happened and had something to apply: not at a step
marked skipped (GradScaler skipped the optimizer step, or the loop never steps), not without
an optimizer where no watched parameter changed (a loop that only looks at gradients), and not
for a parameter whose gradient is negligible beside the others' (the bias of a convolution
followed by BatchNorm, zero up to rounding by construction): a step has nothing but rounding
noise to apply to it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, Reading, StepView

_SHAPE = ("mean", "std", "min", "max", "absmax", "l2")  # a weight's statistics, compared whole
_VISIBLE = 1e-3  # a gradient this large against its weight moves it past rounding at any lr
# A gradient this far below the step's median parameter gradient is negligible: an SGD step
# that moves the typical parameter by 1e-3 of its size moves this one by about 1e-7 of its
# own, as much as float32's rounding.
_NEGLIGIBLE = 1e-4
_EARLY = 8.0  # before the warm-up, a matrix's ratio this many times ``high`` is judged


class UpdateRatio:
    """||update|| / ||weight|| of each parameter, or its being exactly zero.

    Options: ``low`` (1e-7), ``high`` (0.1), ``steps`` (2 recorded steps in a row),
    ``warmup`` (20). Measured ratios are judged from step ``warmup`` on: a parameter that
    starts at zero (a bias, a LayerNorm's shift, a learned position table) has updates as
    large as itself in its first steps, as it should. A ratio of exactly zero is judged at
    once. Nothing is judged at a step with no update (marked skipped; without an optimizer,
    one where no watched parameter changed), nor for a parameter whose gradient is below
    1e-4 times the median of the step's parameter gradients (where ``weight_grad`` is kept).
    """

    name = "update_ratio"
    defaults: ClassVar[dict[str, Any]] = {"low": 1e-7, "high": 0.1, "steps": 2, "warmup": 20}

    def __init__(
        self,
        order: ModuleOrder,
        low: float,
        high: float,
        steps: float,
        warmup: float,
        left_out: frozenset[tuple[str, str]] | None = None,
        matrices: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        self._order = order
        self._patience = int(steps)
        self._matrices = matrices or frozenset()
        self._vectors_spared = matrices is not None
        self._from_zero: set[tuple[str, str]] = set()  # a weight seen equal to its update
        self._warmup = warmup
        # Parameters that need a gradient but are in no group of the optimizer watch() was
        # given; None: no optimizer was given, so unchanged weights tell instead.
        self._left_out = left_out
        self._low = low
        self._high = high
        self._episodes = Episodes(patience=int(steps), recovery=int(steps))
        self._last_weights: dict[tuple[str, str], tuple[float | None, ...]] = {}

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        if view.phase != "train" or view.sentinel:
            return []
        weights = {(r.module, r.tensor): r for r in view.first_calls("weight")}
        grads = {(r.module, r.tensor): r for r in view.first_calls("weight_grad")}
        updates = {(r.module, r.tensor): r for r in view.first_calls("update")}
        shapes = {key: _shape(weight) for key, weight in weights.items()}
        before = {key: self._last_weights.get(key) for key in weights}
        self._last_weights.update(shapes)
        for key, weight in weights.items():
            update = updates.get(key)
            if update is not None and (_shape(update) == shapes[key] or weight.get("l2") == 0):
                self._from_zero.add(key)
        if view.skipped:  # no optimizer step: nothing was updated
            return []
        # Without an optimizer, weights that changed tell that the loop updates at all.
        changed = any(before[key] not in (None, shape) for key, shape in shapes.items())
        typical = _median([g.rms for g in grads.values() if not g.nonfinite and g.rms > 0])
        alerts = []
        for key, weight in weights.items():
            grad = grads.get(key)
            if grad is not None and (grad.nonfinite or not grad.rms > _NEGLIGIBLE * typical):
                continue  # non-finite: the nonfinite rule's; negligible: nothing to apply
            unchanged = changed and before[key] == shapes[key]
            ratio = self._ratio(key, weight, grad, updates.get(key), unchanged)
            warming = key not in self._matrices or key in self._from_zero
            early = ratio is not None and ratio > 0 and view.step < self._warmup
            if ratio is None or (early and (warming or not ratio > self._high * _EARLY)):
                continue
            # Where the matrices are known, a vector's step is never judged too large.
            sized = not self._vectors_spared or key in self._matrices
            too_large = sized and ratio > self._high
            holds = ratio < self._low or too_large
            clear = self._low * 10 <= ratio and (ratio <= self._high / 10 or not sized)
            state = True if holds else (False if clear else None)
            times = self._patience if early and too_large and ratio > self._high * _EARLY else 1
            if any(self._episodes.observe(key, state) for _ in range(times)):
                alerts.append(self._alert(view, weight, ratio, grad is not None))
        return alerts

    def _ratio(
        self,
        key: tuple[str, str],
        weight: Reading,
        grad: Reading | None,
        update: Reading | None,
        unchanged: bool,
    ) -> float | None:
        if weight.nonfinite or not weight.get("l2") > 0:
            return None
        if update is not None and not update.nonfinite:
            return update.get("l2") / weight.get("l2")
        if self._left_out is not None:
            return 0.0 if key in self._left_out else None
        # No update measured and no optimizer known: unchanged whole statistics, while others
        # changed, mean no step where a gradient flowed that a step would not lose in float32's
        # rounding.
        flowing = grad is not None and not grad.nonfinite and grad.rms > _VISIBLE * weight.rms
        return 0.0 if flowing and unchanged else None

    def _alert(self, view: StepView, weight: Reading, ratio: float, has_grad: bool) -> Alert:
        name = weight.module or "the model"
        kind = self._order.type_of(weight.module)
        if ratio == 0.0 and not has_grad:
            how = (
                "the optimizer never changes it, and it has no gradient: is it frozen "
                "(requires_grad False) or unused by the forward pass, and meant to be?"
            )
        elif ratio == 0.0:
            how = (
                "the optimizer never changes it although its gradient is not zero: is it in "
                "the optimizer's parameter groups, with a learning rate above zero?"
            )
        elif ratio < self._low:
            how = f"its updates are {ratio:.2g} of its size (below {self._low:g}): it barely learns"
        else:
            how = f"its updates are {ratio:.2g} of its size (above {self._high:g}): steps too large"
        return Alert.on(
            weight,
            rule=self.name,
            kind="update",
            value=ratio,
            threshold=self._low if ratio < self._low else self._high,
            message=f"update ratio of {name} ({kind}) {weight.tensor} at step {view.step}: {how}",
        )


def _median(values: list[float]) -> float:
    """The median of ``values``; NaN for none."""
    return statistics.median(values) if values else math.nan


def _shape(weight: Reading) -> tuple[float | None, ...]:
    """A weight's statistics, compared whole; None where NaN (a one-element tensor's std)."""
    return tuple(None if value != value else value for value in map(weight.get, _SHAPE))
