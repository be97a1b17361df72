"""``wrong_loss``: probabilities fed to a loss that expects logits.

``cross_entropy`` applies ``log_softmax`` to its input and ``binary_cross_entropy_with_logits``
a sigmoid: given a model's output that is already a softmax or a sigmoid, they squash it a
second time. The training thread reads the autograd graph of the loss passed to
``scope.step`` once, on a recorded step, and gives that step the scalar
``wrong_loss/<module>`` for the module whose output is such a probability; its value says
which probability went into which loss (``WRONG_LOSSES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._order import ModuleOrder

#: The prefix of the scalars the training thread gives a step for a probability in a logits loss.
WRONG_LOSS_SCALAR = "wrong_loss"
#: What a ``wrong_loss/<module>`` scalar's value says: the probability, the operation given it.
WRONG_LOSSES: dict[int, tuple[str, str]] = {
    1: ("softmax", "log_softmax"),
    2: ("sigmoid", "binary_cross_entropy_with_logits"),
    3: ("sigmoid", "log_softmax"),
    4: ("softmax", "binary_cross_entropy_with_logits"),
}
# Module "": a probability of the model's outputs made outside the watched modules.
_OUTSIDE = "the model's output, made outside its watched modules (in its forward or the loss),"
_TAKES = {  # how the loss takes its input as logits
    "log_softmax": "log_softmax (cross_entropy's first step) applies a softmax to it",
    "binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits applies a sigmoid to it",
}
_KEEP = {  # the loss that takes the probability as it is
    "softmax": "nll_loss(torch.log(p)) (nn.NLLLoss on the log)",
    "sigmoid": "binary_cross_entropy (nn.BCELoss)",
}
_SQUASHED = {  # what the second squashing does to the probability
    "log_softmax": (
        "its classes' logits then differ by at most 1, so the loss cannot fall below "
        "log(1 + (C - 1) / e) for C classes and its gradient fades as the model grows sure"
    ),
    "binary_cross_entropy_with_logits": (
        "its predictions then stay between sigmoid(0) = 0.5 and sigmoid(1) = 0.73, so the "
        "loss cannot reach targets of 0 or 1 and its gradient stays large where it is right"
    ),
}


class WrongLoss:
    """Outputs that are probabilities, fed to a loss that expects logits.

    One warning per module, at the step whose loss showed it, naming the module whose output
    is the probability ("": one made from their outputs outside the watched modules). It has
    no options.
    """

    name = "wrong_loss"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, order: ModuleOrder) -> None:
        self._order = order
        self._told: set[str] = set()

    def observe_scalars(self, scalars: Sequence[tuple[int, str, float]]) -> list[Alert]:
        """The alerts of a flush's scalars."""
        prefix = WRONG_LOSS_SCALAR + "/"
        alerts = []
        for step, name, value in scalars:
            module = name.removeprefix(prefix)
            if name.startswith(prefix) and module not in self._told and value in WRONG_LOSSES:
                self._told.add(module)
                alerts.append(self._alert(step, module, int(value)))
        return alerts

    def _alert(self, step: int, module: str, code: int) -> Alert:
        probability, applied = WRONG_LOSSES[code]
        kind = self._order.type_of(module)
        whose = f"{module} ({kind})'s output" if kind else f"{module}'s output"
        whose = whose if module else _OUTSIDE
        again = " again" if (probability, applied) in (WRONG_LOSSES[1], WRONG_LOSSES[2]) else ""
        keep = f", or keep the probabilities and use {_KEEP[probability]}" if again else ""
        return Alert(
            step=step,
            phase="train",
            rule=self.name,
            module=module,
            kind="activation",
            tensor="out",
            severity="warning",
            value=float(code),
            threshold=0.0,
            message=(
                f"{whose} is a {probability}, a probability, and the loss takes it as "
                f"logits: {_TAKES[applied]}{again} (read in the autograd graph of step "
                f"{step}'s loss); {_SQUASHED[applied]}. Feed the logits to the loss (remove "
                f"the final {probability} and apply it only to make predictions){keep}"
            ),
        )
