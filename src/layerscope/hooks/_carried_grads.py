"""A gradient carried over an optimizer step (``zero_grad()`` missing), seen with no sync.

``zero_grad()`` sets each ``.grad`` to None (torch's default) or zeroes it in place, which
bumps the tensor's version counter; backward then accumulates into what ``.grad`` holds. So
where the first backward pass after an optimizer step finds the very ``.grad`` tensor that the
step applied, at the version the step left it in, nothing cleared it: the step to come applies
the sum of both steps' gradients. Micro-batches accumulate with no optimizer step between
them, and an in-place change between two passes (zeroing, scaling) clears the finding, so
gradient accumulation and ``zero_grad(set_to_none=False)`` are left alone.

One parameter is watched, so a pass costs a few attribute reads. A gradient zeroed through
``.data`` keeps its version; so, where the check holds, the largest magnitude of the carried
gradient is taken on its device too (zero: it was cleared after all). The optimizer's step
passes it on as the scalar ``grad_carried`` of the step, for the ``accumulating_grad`` rule.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from layerscope.distributed import local_tensor
from layerscope.health import CARRIED_SCALAR, accumulation_probe
from layerscope.hooks._cost import CostMeter
from layerscope.hooks._handles import HookHandles, weak_hook
from layerscope.hooks._steps import StepClock
from layerscope.recording import Recorder


class CarriedGradients:
    """Watches one parameter's ``.grad`` across the steps of the first optimizer.

    The parameter is ``health.accumulation_probe``'s; without one (no optimizer, nothing
    trainable watched) this does nothing.

    Args:
        targets: the watched modules.
        optimizers: those given to ``watch()``.
        clock: the step in progress.
        recorder: where the step's scalar goes.
        meter: the training thread's cost.
        fail: counts and warns of a monitoring failure.
    """

    def __init__(
        self,
        targets: Sequence[tuple[str, nn.Module]],
        optimizers: Sequence[torch.optim.Optimizer],
        clock: StepClock,
        recorder: Recorder,
        meter: CostMeter,
        fail: Callable[[str, BaseException], None],
    ) -> None:
        probe = accumulation_probe(targets, optimizers)
        self._param: weakref.ref[Tensor] | None = None if probe is None else weakref.ref(probe[2])
        self._optimizer = optimizers[0] if optimizers else None
        self._clock = clock
        self._recorder = recorder
        self._meter = meter
        self._fail = fail
        self._handles = HookHandles()
        # The gradient the last optimizer step applied, and its version then.
        self._applied: tuple[weakref.ref[Tensor], int] | None = None
        # The gradient as the last backward pass left it, and its version then.
        self._accumulated: tuple[weakref.ref[Tensor], int] | None = None
        self._stepped = False  # an optimizer step came since the last backward pass
        self._carried: Tensor | None = None  # largest carried magnitude, on its device

    def register(self) -> None:
        """Hook the parameter's gradient and the optimizer's step."""
        param = None if self._param is None else self._param()
        if param is None or self._optimizer is None:
            return
        self._handles.add(param.register_hook(weak_hook(self._before_accumulation)))  # type: ignore[no-untyped-call]  # untyped in torch
        self._handles.add(
            param.register_post_accumulate_grad_hook(weak_hook(self._after_accumulation))  # type: ignore[no-untyped-call]  # untyped in torch
        )
        self._handles.add(self._optimizer.register_step_pre_hook(weak_hook(self._before_step)))
        self._handles.add(self._optimizer.register_step_post_hook(weak_hook(self._after_step)))

    def remove(self) -> None:
        """Take every hook off; safe to call twice."""
        self._handles.remove()
        self._carried = None

    def _before_accumulation(self, incoming: Tensor) -> None:
        """Backward is about to add ``incoming`` to the parameter's ``.grad``."""
        param = None if self._param is None else self._param()
        if param is None or torch.compiler.is_compiling():
            return
        start = time.perf_counter()
        try:
            grad = param.grad
            if grad is None:
                self._carried = None
            elif self._stepped:
                carried = _same(self._applied, grad)
                self._carried = _largest(grad) if carried else None
            elif not _same(self._accumulated, grad):  # changed in place since the last pass
                self._carried = None
            self._stepped = False
        except Exception as error:
            self._carried = None
            self._fail("checking that the gradient was cleared", error)
        finally:
            self._meter.seconds += time.perf_counter() - start

    def _after_accumulation(self, param: Tensor) -> None:
        grad = param.grad
        self._accumulated = None if grad is None else (weakref.ref(grad), grad._version)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._carried is not None:
            carried, self._carried = self._carried, None
            self._recorder.add_scalars(self._clock.step, {CARRIED_SCALAR: carried})

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        param = None if self._param is None else self._param()
        grad = None if param is None else param.grad
        self._applied = None if grad is None else (weakref.ref(grad), grad._version)
        self._stepped = True


def _same(kept: tuple[weakref.ref[Tensor], int] | None, grad: Tensor) -> bool:
    """Whether ``grad`` is the tensor ``kept`` refers to, unchanged in place since."""
    return kept is not None and kept[0]() is grad and kept[1] == grad._version


def _largest(grad: Tensor) -> Tensor | None:
    """The largest magnitude in ``grad``, a 0-d tensor on its device; None where it is empty."""
    local = local_tensor(grad)  # a DTensor's own shard: no collective
    if local.numel() == 0:
        return None
    with torch.no_grad():
        return local.detach().abs().amax().float()
