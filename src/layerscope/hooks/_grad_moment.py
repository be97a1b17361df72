"""The moment a parameter's gradient is the one its optimizer sees, for any reader.

``ParameterReads`` reads weight gradients for statistics at these moments, and whole-tensor
captures read them at the same ones: with optimizers, just before each one's step (after
accumulation, unscaling and clipping), or when the closure of an LBFGS-style step returns;
without one, when a backward pass has ended and every callback queued in it has run (DDP's,
which writes the all-reduced gradients back). Each backward overwrites the last reading, so
after the final micro-batch it is the accumulated gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from layerscope.hooks._handles import HookHandles, queue_at_backward_end, weak_hook
from layerscope.hooks._optimizers import owned_by


def after_backward_callbacks(callback: Callable[[], None]) -> None:
    """Run ``callback`` after the running backward pass and the callbacks queued in it.

    Queued from a gradient hook, a callback runs before those queued later in the pass, such
    as DDP's, which writes the all-reduced gradients back when its last bucket is done. Queued
    again from there, ``callback`` runs after all of them.
    """
    queue_at_backward_end(lambda: queue_at_backward_end(callback))


def closure_then(args: Any, kwargs: Any, then: Callable[[], None]) -> tuple[Any, Any] | None:
    """An optimizer step's ``(args, kwargs)`` whose closure calls ``then`` when it returns.

    None where the step takes no closure. ``args[0]`` is the optimizer itself; the closure
    follows it or comes by keyword.
    """
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if closure is None:
        return None

    def closure_then_read() -> Any:
        loss = closure()
        then()
        return loss

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure_then_read}
    return (args[0], closure_then_read, *args[2:]), kwargs


class GradientMoments:
    """Calls ``read(positions)`` when gradients of ``params`` are those the optimizer sees.

    ``positions`` index ``params``: those the stepping optimizer owns, or all of them without
    optimizers. With optimizers, ``backward_pending`` tells that a backward pass reached the
    parameters since the last reading: a step that GradScaler skipped has no optimizer
    moment, and its reader may take what backward left at the step's end.

    Args:
        params: the parameters to read.
        optimizers: those whose steps are the moments; none: the ends of backward passes.
        read: ``read(positions)``, called at each moment.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        optimizers: Sequence[torch.optim.Optimizer],
        read: Callable[[list[int]], None],
    ) -> None:
        self._params = list(params)
        self._optimizers = list(optimizers)
        self._read = read
        self._handles = HookHandles()
        self._queued = False
        self.backward_pending = False

    def attach(self) -> None:
        """Hook the optimizers' steps, and each parameter's gradient accumulation."""
        for index, optimizer in enumerate(self._optimizers):
            self._handles.add(optimizer.register_step_pre_hook(partial(self._before_step, index)))
        for param in self._params:
            if param.requires_grad:
                self._handles.add(
                    param.register_post_accumulate_grad_hook(weak_hook(self._on_accumulated))  # type: ignore[no-untyped-call]  # untyped in torch
                )

    def remove(self) -> None:
        """Take every hook off; safe to call twice."""
        self._handles.remove()
        self._queued = False
        self.backward_pending = False

    def __len__(self) -> int:
        return len(self._handles)

    def _on_accumulated(self, param: Tensor) -> None:
        if torch.compiler.is_compiling() or not len(self._handles):
            return
        self.backward_pending = True
        if not self._optimizers and not self._queued:
            self._queued = True
            after_backward_callbacks(self._after_backward)

    def _after_backward(self) -> None:
        self._queued = False
        if len(self._handles):
            self._read_now(list(range(len(self._params))))

    def _before_step(
        self, index: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if not len(self._handles):
            return None
        positions = owned_by(self._optimizers, index, self._params)
        changed = closure_then(args, kwargs, partial(self._read_now, positions))
        if changed is None:
            self._read_now(positions)
        return changed

    def _read_now(self, positions: list[int]) -> None:
        self.backward_pending = False
        self._read(positions)
