"""``nonfinite``: the first NaN or Inf, and the module it came from."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from rowwise.readings import ModuleOrder, Reading, StepView

# Where a step's values come from, in the order they are computed: the forward pass (its
# inputs, then outputs), the backward pass, then what the optimizer step reads and writes.
_FORWARD = ("input", "activation")
_BACKWARD = ("grad", "weight_grad")
_AFTER = ("update", "weight", "buffer")


class NonFinite:
    """The first non-finite value of an episode, attributed to its origin.

    The origin is the first module in forward order whose output is non-finite (its inputs,
    the outputs before it, were finite); where the forward pass was clean, the first gradient
    in backward order that is non-finite: the backward of the module after it made it. A step
    with no non-finite value ends the episode. Where steps went unseen before the first bad
    one (no sentinel), the alert says between which steps it happened. Where only the
    parameters' gradients were watched (the gradients' sentinel), the alert says so, with the
    last layer in forward order whose gradient is non-finite. A step whose optimizer
    step was skipped (marked ``skipped``: GradScaler found an Inf in the gradients) with only
    its gradients non-finite is GradScaler at work, not a fault: no alert.
    """

    name = "nonfinite"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, order: ModuleOrder) -> None:
        self._order = order
        self._episodes = Episodes()
        self._last_seen: dict[str, int] = {}  # the last step seen of each phase

    def observe(self, view: StepView) -> list[Alert]:
        """Alerts of one step's rows."""
        bad = [r for r in view.readings if r.nonfinite]
        nan_at_skip = False
        if view.skipped and bad and all(r.kind in _BACKWARD for r in bad):
            # GradScaler's overflow: it skipped the step and lowers its scale, by design;
            # unless no Inf is among them.
            nan_at_skip = not any(_holds_inf(r) for r in bad)
            bad = bad if nan_at_skip else []
        previous = self._last_seen.get(view.phase)
        self._last_seen[view.phase] = view.step
        if not self._episodes.observe(view.phase, bool(bad)):
            return []
        origin, how = self._origin(bad, view)
        unwatched = view.phase == "train" and (
            (previous is not None and view.step > previous + 1)
            or (previous is None and view.step > 0)
        )
        poisoned = unwatched and _poisoned(origin, bad)
        if poisoned:
            weights = ", ".join(
                r.tensor for r in bad if r.kind == "weight" and r.module == origin.module
            )
            how = (
                f"every value of {self._named(origin.module)}'s output {origin.tensor}, the first "
                f"non-finite one in forward order, is non-finite, and so is its {weights}: an "
                "update of an earlier step, not watched, poisoned the weights, so where the value "
                "began is not among this step's; Schedule(sentinel=True) names the layer and step "
                "where it is born"
            )
        if nan_at_skip:
            how += (
                "; the optimizer step was skipped (GradScaler), but the gradients hold NaN and "
                "no Inf: an overflow makes an Inf first, and no scale makes this NaN go away"
            )
        where = f"at step {view.step}"
        if view.phase == "train" and previous is not None and view.step > previous + 1:
            where = (
                f"between steps {previous + 1} and {view.step} (the steps between were not "
                "watched; Schedule(sentinel=True) finds the exact step)"
            )
        elif view.phase == "train" and previous is None and view.step > 0:
            where = f"at step {view.step} or before (the first step watched)"
        counts = _counts(origin)
        message = f"first non-finite value {where} ({view.phase}): {how}{counts}"
        alert = Alert.on(
            origin,
            rule=self.name,
            severity="error",
            value=origin.get("nan_count") + origin.get("inf_count")
            if not origin.sentinel
            else float("nan"),
            threshold=0.0,
            message=message,
        )
        if poisoned:
            alert = dataclasses.replace(alert, module="", kind="weight", tensor="")
        return [alert]

    def _origin(self, bad: list[Reading], view: StepView) -> tuple[Reading, str]:
        forward = sorted(
            (r for r in bad if r.kind in _FORWARD),
            key=lambda r: (r.call, r.kind != "input", self._order.forward(r.module)),
        )
        if forward:
            first = forward[0]
            if first.kind == "input":
                return first, f"the input of {self._named(first.module)} is already non-finite"
            return first, (
                f"the output {first.tensor} of {self._named(first.module)} is the first "
                "non-finite one in forward order"
            )
        backward = sorted(
            (r for r in bad if r.kind in _BACKWARD),
            key=lambda r: (r.kind != "grad", -self._order.forward(r.module)[1], r.call),
        )
        if backward:
            first = backward[0]
            if first.kind == "grad":
                source = self._producer(first, view)
                return first, (
                    f"the forward pass was finite; the gradient of {self._named(first.module)}'s "
                    f"output is the first non-finite one in backward order{source}"
                )
            if not any(r.kind in _FORWARD for r in view.readings):  # the gradients' sentinel
                return first, (
                    f"the gradients of {len(backward)} watched parameters are non-finite, the "
                    f"last in forward order {self._named(first.module)}'s {first.tensor} (a "
                    "value born in the backward pass came from there or the layer after it; "
                    "one born in the forward pass, which this step's sentinel does not see, "
                    "reaches every gradient: Schedule(sentinel=True) names its layer)"
                )
            return first, (
                f"the forward pass was finite; the gradient of {self._named(first.module)}'s "
                f"{first.tensor} is non-finite"
            )
        first = sorted(
            bad,
            key=lambda r: (
                _AFTER.index(r.kind) if r.kind in _AFTER else 3,
                self._order.model(r.module),
            ),
        )[0]
        return first, (
            f"the {first.kind} {first.tensor} of {self._named(first.module)} is non-finite "
            "while its forward and backward passes were finite"
        )

    def _producer(self, origin: Reading, view: StepView) -> str:
        """Which module's backward made ``origin``: the next watched one in forward order."""
        later = sorted(
            (r for r in view.first_calls("grad") if not r.nonfinite),
            key=lambda r: self._order.forward(r.module),
        )
        after = [
            r for r in later if self._order.forward(r.module) > self._order.forward(origin.module)
        ]
        if not after:
            return ""
        return f": the backward of {self._named(after[0].module)} made it"

    def _named(self, module: str) -> str:
        kind = self._order.type_of(module)
        name = module or "the model"
        return f"{name} ({kind})" if kind else name


def _holds_inf(reading: Reading) -> bool:
    if not reading.sentinel:
        return reading.get("inf_count") != 0
    return math.isinf(reading.get("min")) or math.isinf(reading.get("max"))


def _poisoned(origin: Reading, bad: list[Reading]) -> bool:
    if origin.kind != "activation" or origin.sentinel:
        return False
    whole = origin.get("nan_count") + origin.get("inf_count") >= origin.get("numel")
    return whole and any(r.kind == "weight" and r.module == origin.module for r in bad)


def _counts(reading: Reading) -> str:
    if reading.sentinel:
        return ""
    nan, inf = int(reading.get("nan_count")), int(reading.get("inf_count"))
    return f"; {nan} NaN and {inf} Inf of {int(reading.get('numel'))} values"
