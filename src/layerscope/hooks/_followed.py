"""Steps without asking: the optimizer that steps the watched parameters, found as it steps.

wandb.watch and fastai users never end a step themselves. Without ``optimizer=``, torch's
process-wide step hooks see every optimizer's step: the first one that steps every watched
parameter that needs a gradient is followed from that step on, as if ``watch()`` had been
given it: its step ends the training step and the gradients are read just before it.

A loop that calls ``scope.step()`` before any such optimizer stepped ends its steps itself:
none is followed then. One that steps only part of the watched parameters (a GAN's two
optimizers under one watched model) is not followed either: its step may end half an
iteration. Where nothing ends a step and the weights change between two backward passes, one
warning says that the run's iterations are merging into one step.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from layerscope._errors import LayerscopeWarning
from layerscope.hooks._handles import HookHandles, weak_hook
from layerscope.hooks._optimizers import parameters_of

StepHook = Callable[[torch.optim.Optimizer, Any, Any], Any]

MERGING = (
    "layerscope: the watched parameters changed between two backward passes, but nothing "
    "ended a step: every iteration so far is step {step}. Call scope.step() once per "
    "iteration, or pass optimizer= to watch() (its step then ends each step){why}"
)


class FollowedOptimizer:
    """Finds and follows the optimizer that steps the watched parameters.

    Args:
        params: the watched parameters; those that need a gradient must all be stepped by
            the optimizer followed.
        found: called with that optimizer at its first step, before its reads; returns the
            hooks to run around each of its steps from then on, this one included.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        found: Callable[[torch.optim.Optimizer], tuple[StepHook, StepHook]],
    ) -> None:
        self._trainable = {id(param) for param in params if param.requires_grad}
        self._found = found
        self._followed: weakref.ref[torch.optim.Optimizer] | None = None
        self._hooks: tuple[StepHook, StepHook] | None = None
        self._listening = bool(self._trainable)  # until scope.step() says it ends steps
        # Optimizers that were not followed, with how many parameters they stepped then.
        self._refused: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = (
            weakref.WeakKeyDictionary()
        )
        self._partial: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._handles = HookHandles()
        self._version: int | None = None  # the probe's at the step's last backward pass
        self._warned = False

    @property
    def following(self) -> bool:
        """Whether an optimizer was found and ends the steps now."""
        return self._hooks is not None

    def register(self) -> None:
        """Hook every optimizer's step, process-wide, while nothing is followed."""
        if self._listening:
            self._handles.add(register_optimizer_step_pre_hook(weak_hook(self._before)))
            self._handles.add(register_optimizer_step_post_hook(weak_hook(self._after)))

    def remove(self) -> None:
        """Take the hooks off; safe to call twice."""
        self._handles.remove()
        self._hooks = None
        self._listening = False

    def steps_given(self) -> None:
        """``scope.step()`` ends steps: follow no optimizer found from now on."""
        if self._listening and self._hooks is None:
            self.remove()
        self._listening = False

    def backward_ran(self, probe: Tensor, step: int) -> None:
        """A backward pass reached ``probe``: warn once if the weights changed since the last.

        A parameter's version counts its in-place changes: an optimizer's or a hand-written
        update between two backward passes of one step is an iteration that never ended.
        """
        if not self._listening or self._hooks is not None or self._warned:
            return
        version = probe._version
        if self._version is not None and version != self._version:
            self._warned = True
            why = _partial_ones(sorted(type(o).__name__ for o in self._partial))
            warnings.warn(MERGING.format(step=step, why=why), LayerscopeWarning, stacklevel=2)
        self._version = version

    def step_ended(self) -> None:
        """A step ended: the next backward pass is the first of its step."""
        self._version = None

    def _before(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if self._hooks is None:
            if not self._listening or not self._steps_all(optimizer):
                return None
            self._followed = weakref.ref(optimizer)
            self._hooks = self._found(optimizer)
        followed = None if self._followed is None else self._followed()
        if followed is optimizer:
            return self._hooks[0](optimizer, args, kwargs)
        return None

    def _after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        followed = None if self._followed is None else self._followed()
        if self._hooks is not None and followed is optimizer:
            self._hooks[1](optimizer, args, kwargs)

    def _steps_all(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` steps every watched parameter that needs a gradient."""
        count = sum(len(group["params"]) for group in optimizer.param_groups)
        if self._refused.get(optimizer) == count:  # asked before, and no group added since
            return False
        stepped = {id(param) for param in parameters_of(optimizer)}
        if self._trainable <= stepped:
            return True
        self._refused[optimizer] = count
        if self._trainable & stepped:
            self._partial.add(optimizer)
        return False


def _partial_ones(names: list[str]) -> str:
    """Why no optimizer is followed, where some stepped part of the watched parameters."""
    if not names:
        return ""
    if len(names) == 1:
        return (
            f"; an optimizer ({names[0]}) steps only part of the watched parameters: not followed"
        )
    return (
        f"; the optimizers ({', '.join(names)}) each step only part of the watched "
        "parameters: none is followed (optimizer=[...] lists them, the last to step first)"
    )
