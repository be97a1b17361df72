"""``nonfinite``: the first NaN or Inf, and the module it came from."""

from __future__ import annotations

from typing import Any, ClassVar

from layerscope.health._alert import Alert, Found
from layerscope.health._codes import ACTIVATION, FIRST_CALL, GRAD, INPUT, KIND, WEIGHT_GRAD
from layerscope.health._episodes import Episodes
from layerscope.health._order import ModuleOrder
from layerscope.health._readings import Flush, Reading

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
            # GradScaler's overflow (only gradients bad at a skipped step): by design.
            scaler = view.skipped and not forward_bad[index]
            previous = self._last_seen.get(view.phase)
            self._last_seen[view.phase] = view.step
            if not self._episodes.observe(view.phase, counts[index] > 0 and not scaler):
                continue
            in_view = flush.view == index
            rows = (bad & in_view).nonzero().flatten().tolist()
            origin, how = self._origin([flush.reading(row) for row in rows], flush, index)
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
            found.append((index, (), alert))
        return found

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


def _counts(reading: Reading) -> str:
    if reading.sentinel:
        return ""
    nan, inf = int(reading.get("nan_count")), int(reading.get("inf_count"))
    return f"; {nan} NaN and {inf} Inf of {int(reading.get('numel'))} values"
