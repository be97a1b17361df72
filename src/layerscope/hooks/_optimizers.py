"""The ``optimizer=`` argument: one optimizer or several, looked through their wrappers.

Trainers wrap the optimizer a person made: accelerate's ``AcceleratedOptimizer`` (the HF
Trainer's, once training started) and Lightning's ``LightningOptimizer`` call the wrapped one's
``step()``, and some of them subclass ``torch.optim.Optimizer`` without its hook registries.
Hooks go on the innermost optimizer, whose ``step()`` runs whatever the wrapper does. A wrapper
may also not run it: accelerate's holds the step back on the micro-batches of
``accumulate()``, which are part of the step to come, not steps of their own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

_WRAPPED = ("optimizer", "_optimizer")  # accelerate, Lightning


def unwrap_optimizer(optimizer: object) -> torch.optim.Optimizer:
    """The optimizer whose ``step()`` runs, with its step hooks; TypeError naming ``optimizer``.

    Examples:
        >>> import torch
        >>> sgd = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> unwrap_optimizer(sgd) is sgd
        True
    """
    seen = optimizer
    for _ in range(8):  # wrappers of wrappers, never a cycle
        inner = next(
            (
                value
                for value in (getattr(seen, name, None) for name in _WRAPPED)
                if value is not None and value is not seen and _has_step(value)
            ),
            None,
        )
        if inner is None:
            break
        seen = inner
    if not isinstance(seen, torch.optim.Optimizer) or not _hookable(seen):
        raise TypeError(
            f"optimizer: expected a torch.optim.Optimizer (or a wrapper of one, such as "
            f"accelerate's or Lightning's) whose step() takes hooks, got "
            f"{type(optimizer).__name__}"
        )
    return seen


def parse_optimizers(optimizer: object) -> list[torch.optim.Optimizer]:
    """``optimizer=``: None, one optimizer, or a list of them (the first one's step ends a step)."""
    if optimizer is None:
        return []
    if isinstance(optimizer, list | tuple):
        if not optimizer:
            raise ValueError("optimizer: expected an optimizer or a non-empty list of them")
        optimizers = [unwrap_optimizer(item) for item in optimizer]
    else:
        optimizers = [unwrap_optimizer(optimizer)]
    if len({id(item) for item in optimizers}) != len(optimizers):
        raise ValueError("optimizer: the same optimizer is listed twice")
    return optimizers


def step_held_back() -> bool:
    """Whether accelerate holds the optimizer step back now: a micro-batch of ``accumulate()``.

    Its optimizer's ``step()`` does nothing while ``accelerator.sync_gradients`` is False, a
    state one per process (``GradientState``), read here as it is and never made. That also
    covers a loop that steps only ``if accelerator.sync_gradients``.
    """
    state = getattr(sys.modules.get("accelerate.state"), "GradientState", None)
    shared = getattr(state, "_shared_state", None)  # empty until an Accelerator is made
    return isinstance(shared, dict) and shared.get("sync_gradients", True) is False


def parameters_of(optimizer: torch.optim.Optimizer) -> Iterator[Tensor]:
    """The parameters ``optimizer`` steps, read now: ``add_param_group`` may add some."""
    for group in optimizer.param_groups:
        yield from group["params"]


def owned_by(
    optimizers: Sequence[torch.optim.Optimizer], index: int, params: Sequence[Tensor]
) -> list[int]:
    """Positions in ``params`` that optimizer ``index`` reads before its step.

    Each optimizer reads its own parameters; the first one also reads those no optimizer
    steps (frozen ones keep no gradient, but a hand-written update may use one).
    """
    if len(optimizers) == 1:
        return list(range(len(params)))
    mine = {id(p) for p in parameters_of(optimizers[index])}
    others = (
        {id(p) for i, opt in enumerate(optimizers) if i != index for p in parameters_of(opt)}
        if index == 0
        else set()
    )
    return [
        position
        for position, param in enumerate(params)
        if id(param) in mine or (index == 0 and id(param) not in others)
    ]


def _has_step(value: object) -> bool:
    return callable(getattr(value, "step", None)) and hasattr(value, "param_groups")


def _hookable(optimizer: torch.optim.Optimizer) -> bool:
    # accelerate's wrapper subclasses Optimizer but never runs its __init__: no registries.
    return hasattr(optimizer, "_optimizer_step_pre_hooks") and hasattr(
        optimizer, "_optimizer_step_post_hooks"
    )
