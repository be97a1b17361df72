"""One training iteration, with the knobs the zoo's bugs turn.

A case builds a ``Loop`` for itself and for its healthy twin; the bug is a knob set otherwise:
a change made at the start of some step (``before``), other batches, another objective, no
``zero_grad``, a GradScaler, gradient clipping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

# What the model is trained on, of its output, the targets and the step: the loss to run
# backward on, and the loss to log.
Objective = Callable[[Any, Any, int], tuple[Tensor, Tensor]]


def objective(loss: Callable[[Any, Any], Tensor]) -> Objective:
    """An objective whose logged loss is the one run backward."""

    def both(output: Any, target: Any, step: int) -> tuple[Tensor, Tensor]:
        value = loss(output, target)
        return value, value

    return both


def cross_entropy(output: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy over the last dimension, for any leading shape (tokens too)."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _nothing(step: int) -> None:
    return None


def _always(step: int) -> bool:
    return True


@dataclass(kw_only=True)
class Loop:
    """A training iteration: ``loop(step)`` trains one step and returns the loss to log.

    Attributes:
        model: the model.
        optimizer: its optimizer, given to ``watch``.
        batch: the inputs and targets of a step.
        objective: what backward runs on and what is logged.
        before: changes made at the start of a step (the model's, the optimizer's).
        zero_grad: whether a step ends by clearing the gradients.
        clip: the norm gradients are clipped to before the optimizer's step, if any.
        scaler: a GradScaler that scales the loss and may skip the optimizer's step.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[int], tuple[Any, Any]]
    objective: Objective = field(default_factory=lambda: objective(cross_entropy))
    before: Callable[[int], None] = _nothing
    zero_grad: Callable[[int], bool] = _always
    clip: float | None = None
    scaler: torch.amp.GradScaler | None = None

    def __call__(self, step: int) -> Tensor:
        self.before(step)
        inputs, target = self.batch(step)
        trained, logged = self.objective(self.model(inputs), target, step)
        if self.scaler is not None:
            self.scaler.scale(trained).backward()  # type: ignore[no-untyped-call]  # untyped in torch
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            trained.backward()  # type: ignore[no-untyped-call]  # untyped in torch
            if self.clip is not None:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.optimizer.step()
        if self.zero_grad(step):
            self.optimizer.zero_grad()
        return logged  # undetached, as the README passes it to scope.step
