"""``eval_mode``: training passes through BatchNorm or Dropout left in eval mode.

In eval mode BatchNorm normalises with its running statistics, not the batch's, and Dropout
drops nothing. A forward pass whose backward pass the step's optimizer step applies is
training, whatever the modules' ``training`` flags say: the training thread gives the step the
scalar ``eval_mode/<module>`` for each BatchNorm or Dropout that it found in eval mode (1) or
in eval mode and frozen, its parameters needing no gradient (0), when that begins. Frozen
BatchNorm is a fine-tuning recipe: a note, not a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._order import ModuleOrder

#: The prefix of the scalars the training thread gives a step for modules trained in eval mode.
EVAL_MODE_SCALAR = "eval_mode"
_NAMED = 3  # modules named in a message besides the first


class EvalMode:
    """BatchNorm and Dropout modules that training passes ran in eval mode.

    One alert per step at which some begin to: a warning naming the first of them in the
    forward pass (and how many more), or, where all are frozen, an info note. It has no
    options.
    """

    name = "eval_mode"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, order: ModuleOrder) -> None:
        self._order = order

    def observe_scalars(self, scalars: Sequence[tuple[int, str, float]]) -> list[Alert]:
        """The alerts of a flush's scalars."""
        prefix = EVAL_MODE_SCALAR + "/"
        by_step: dict[tuple[int, bool], list[str]] = {}
        for step, name, value in scalars:
            if name.startswith(prefix):
                by_step.setdefault((step, value == 0.0), []).append(name.removeprefix(prefix))
        return [
            self._alert(step, frozen, sorted(modules, key=self._order.forward))
            for (step, frozen), modules in sorted(by_step.items())
        ]

    def _alert(self, step: int, frozen: bool, modules: list[str]) -> Alert:
        first = modules[0]
        named = ", ".join(modules[1 : 1 + _NAMED])
        more = len(modules) - 1 - _NAMED
        others = f" (and {named}{f' and {more} more' if more > 0 else ''})" if named else ""
        kind = self._order.type_of(first) or "module"
        if frozen:
            severity = "info"
            how = (
                "with their parameters frozen: they keep their running statistics, as "
                "fine-tuning with frozen BatchNorm does; if they should adapt to this data, "
                "call .train() on them and let their parameters train"
            )
        else:
            severity = "warning"
            how = (
                "where BatchNorm normalises with its running statistics instead of the "
                "batch's and Dropout drops nothing. Call model.train() after each evaluation, "
                "and look for an .eval() on these modules (a freezing function meant for "
                "fine-tuning)"
            )
        return Alert(
            step=step,
            phase="train",
            rule=self.name,
            module=first,
            kind="activation",
            tensor="out",
            severity=severity,
            value=float(len(modules)),
            threshold=0.0,
            message=(
                f"{first} ({kind}){others} ran in eval mode in training passes (forward "
                f"passes whose backward pass an optimizer step applied) from step {step}, {how}"
            ),
        )
