"""``nonfinite``: the first NaN or Inf, and the module it came from."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from layerscope.health._alert import Alert, Found
from layerscope.health._codes import ACTIVATION, FIRST_CALL, GRAD, INPUT, KIND, WEIGHT_GRAD
from layerscope.health._episodes import Episodes
from layerscope.health._order import ModuleOrder
from layerscope.health._readings import Flush, Reading

# Where a step's values come from, in the order they are computed: the forward pass (its
# inputs, then outputs), the backward pass, then what the optimizer step reads and writes.
_FORWARD = ("input", "activation")
_BACKWARD = ("grad", "input_grad", "weight_grad")
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
    its gradients non-finite is GradScaler at work, not a fault: no alert, unless they hold
    NaN and no Inf (an overflow makes an Inf first; a NaN stays however low the scale goes).

    The logged ``loss`` comes every step: its first non-finite value after a finite one opens
    the episode at its step where no watched row has (the layers' rows of the steps between
    recorded ones are not kept without a sentinel). Where the first non-finite output of a
    recorded step after unwatched ones is all non-finite, of a module whose weights are
    non-finite, an update of an earlier step poisoned them: the alert names no layer then.
    """

    name = "nonfinite"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, order: ModuleOrder) -> None:
        self._order = order
        self._episodes = Episodes()
        self._last_seen: dict[str, int] = {}  # the last step seen of each phase
        self._losses: list[tuple[int, float]] = []  # heard, not yet read: (step, value)
        self._loss_alerts: list[Alert] = []
        self._last_finite_loss: int | None = None
        self._loss_bad = False  # whether the last loss read was non-finite

    def hear(self, scalars: Sequence[tuple[int, str, float]]) -> None:
        """Take a flush's scalars; its ``loss`` values are read in step order with its rows."""
        self._losses += [(step, value) for step, name, value in scalars if name == "loss"]
        self._losses.sort(key=lambda item: item[0])

    def loss_alerts(self) -> list[Alert]:
        """The alerts of the losses heard: those read with the rows, then the rest."""
        self._read_losses(None)
        alerts, self._loss_alerts = self._loss_alerts, []
        return alerts

    def observe(self, flush: Flush) -> list[Found]:
        """Alerts of a flush's rows: the steps' counts of bad rows, read in order."""
        if not len(flush):
            return []
        kind = flush.field(KIND)
        bad = flush.nonfinite
        backward = (kind == GRAD) | (kind == WEIGHT_GRAD)
        counts = flush.per_view(bad)
        forward_bad = flush.per_view(bad & ~backward)
        found: list[Found] = []
        for index, view in enumerate(flush.views):
            if view.phase == "train":
                self._read_losses(view.step)  # the losses of the steps before it
            holds = counts[index] > 0
            readings: list[Reading] | None = None
            nan_not_overflow = False
            if holds and view.skipped and not forward_bad[index]:
                # Only gradients bad at a skipped step: GradScaler's overflow, by design,
                # unless no Inf is among them.
                readings = self._bad_readings(flush, bad, index)
                holds = nan_not_overflow = not any(_holds_inf(r) for r in readings)
            previous = self._last_seen.get(view.phase)
            self._last_seen[view.phase] = view.step
            if not self._episodes.observe(view.phase, holds):
                continue
            if readings is None:
                readings = self._bad_readings(flush, bad, index)
            unwatched = view.phase == "train" and (
                (previous is not None and view.step > previous + 1)
                or (previous is None and view.step > 0)
            )
            origin, how = self._origin(readings, flush, index)
            poisoned = unwatched and _poisoned(origin, readings)
            if poisoned:
                how = self._poisoned_how(origin, readings)
            if nan_not_overflow:
                how += _NAN_AT_SKIP
            where = f"at step {view.step}"
            if view.phase == "train" and previous is not None and view.step > previous + 1:
                where = (
                    f"between steps {previous + 1} and {view.step} (the steps between were not "
                    "watched; Schedule(sentinel=True) finds the exact step)"
                )
            elif view.phase == "train" and previous is None and view.step > 0:
                where = f"at step {view.step} or before (the first step watched)"
            message = f"first non-finite value {where} ({view.phase}): {how}{_counts(origin)}"
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
            if poisoned:  # the layer is where it arrived, not where it began
                alert = dataclasses.replace(alert, module="", kind="weight", tensor="")
            found.append((index, (), alert))
        return found

    def _bad_readings(self, flush: Flush, bad: Any, index: int) -> list[Reading]:
        rows = (bad & (flush.view == index)).nonzero().flatten().tolist()
        return [flush.reading(row) for row in rows]

    def _read_losses(self, before: int | None) -> None:
        """Read the losses heard of the steps before ``before`` (None: all of them)."""
        upto = len(self._losses)
        if before is not None:
            upto = next((at for at, (step, _) in enumerate(self._losses) if step >= before), upto)
        taken, self._losses = self._losses[:upto], self._losses[upto:]
        for step, value in taken:
            alert = self._loss(step, value)
            if alert is not None:
                self._loss_alerts.append(alert)

    def _loss(self, step: int, value: float) -> Alert | None:
        """The alert of a loss that turned non-finite, where no row opened the episode."""
        bad = not math.isfinite(value)
        was_bad, self._loss_bad = self._loss_bad, bad
        last_finite = self._last_finite_loss
        if not bad:
            self._last_finite_loss = step
            return None
        if was_bad or not self._episodes.observe("train", True):
            return None
        seen = self._last_seen.get("train")
        if last_finite is not None:
            since = (
                f"finite at step {last_finite}: the value began in that step's backward pass "
                f"or update, or in this step's forward pass"
                if last_finite == step - 1
                else f"finite at step {last_finite}"
            )
        else:
            since = "the first loss logged"
        if seen == step:
            watched = (
                "what was watched of this step is finite, so the loss's own computation made "
                "it: outputs too large for it to square or exponentiate (a diverging model: "
                "look at this step's largest outputs), a log or a division of zero, a target "
                "out of range"
            )
        else:
            last = f"step {seen}" if seen is not None else "none"
            watched = (
                f"no layer was watched at this step (the last watched: {last}); the next "
                "recorded step shows the layers, but by then an update from a non-finite "
                "gradient may have made every weight non-finite: Schedule(sentinel=True) names "
                "the layer where it is born, at its step"
            )
        return Alert.of_model(
            step,
            rule=self.name,
            tensor="loss",
            severity="error",
            value=value,
            threshold=0.0,
            message=f"first non-finite value at step {step} (train): the loss is {value} "
            f"({since}); {watched}",
        )

    def _poisoned_how(self, origin: Reading, readings: list[Reading]) -> str:
        weights = ", ".join(
            r.tensor for r in readings if r.kind == "weight" and r.module == origin.module
        )
        return (
            f"every value of {self._named(origin.module)}'s output {origin.tensor}, the first "
            f"non-finite one in forward order, is non-finite, and so is its {weights}: an "
            "update of an earlier step, not watched, poisoned the weights, so where the value "
            "began is not among this step's; Schedule(sentinel=True) names the layer and step "
            "where it is born"
        )

    def _origin(self, bad: list[Reading], flush: Flush, index: int) -> tuple[Reading, str]:
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
                source = self._producer(first, flush, index)
                return first, (
                    f"the forward pass was finite; the gradient of {self._named(first.module)}'s "
                    f"output is the first non-finite one in backward order{source}"
                )
            kind = flush.field(KIND)
            forward_rows = (kind == INPUT) | (kind == ACTIVATION)
            if not flush.per_view(forward_rows)[index]:  # the gradients' sentinel
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

    def _producer(self, origin: Reading, flush: Flush, index: int) -> str:
        """Which module's backward made ``origin``: the next watched one in forward order."""
        clean = (
            (flush.view == index)
            & (flush.field(KIND) == GRAD)
            & (flush.field(FIRST_CALL) == 1)
            & ~flush.nonfinite
        )
        modules = [flush.reading(row).module for row in clean.nonzero().flatten().tolist()]
        place = self._order.forward(origin.module)
        after = sorted(
            (m for m in modules if self._order.forward(m) > place), key=self._order.forward
        )
        if not after:
            return ""
        return f": the backward of {self._named(after[0])} made it"

    def _named(self, module: str) -> str:
        kind = self._order.type_of(module)
        name = module or "the model"
        return f"{name} ({kind})" if kind else name


_NAN_AT_SKIP = (
    "; the optimizer step was skipped (GradScaler), but the gradients hold NaN and no Inf: "
    "an overflow makes an Inf first, and no scale makes this NaN go away"
)


def _holds_inf(reading: Reading) -> bool:
    """Whether a row holds an Inf; a sentinel's extremes tell only where no NaN hides it."""
    if not reading.sentinel:
        return reading.get("inf_count") != 0  # NaN, a count not kept, may hold one
    return math.isinf(reading.get("min")) or math.isinf(reading.get("max"))


def _poisoned(origin: Reading, readings: list[Reading]) -> bool:
    """Whether ``origin``, a forward output, is all non-finite and its module's weights too."""
    if origin.kind != "activation" or origin.sentinel:
        return False
    whole = origin.get("nan_count") + origin.get("inf_count") >= origin.get("numel")
    return whole and any(r.kind == "weight" and r.module == origin.module for r in readings)


def _counts(reading: Reading) -> str:
    if reading.sentinel:
        return ""
    nan, inf = int(reading.get("nan_count")), int(reading.get("inf_count"))
    return f"; {nan} NaN and {inf} Inf of {int(reading.get('numel'))} values"
