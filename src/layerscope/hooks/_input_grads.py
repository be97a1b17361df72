"""Gradients with respect to a module's inputs, through that module alone (kind ``input_grad``).

On a recorded training pass each tensor argument that needs a gradient enters the module as a
view of itself that carries a gradient hook. The hook receives the gradient of the loss through
this module alone, as torchfunc's ``BackwardInput`` (a full backward hook) does, where a hook
on the argument itself would get the sum over every use of it (a residual's two paths, the
query, key and value projections of one input). A view, not a copy: the module may change its
input in place and the caller sees it, as without the hook; a view shares the argument's
version counter, so what autograd refuses or allows is unchanged. An input the module changes
in place has no ``input_grad`` row: its value before the module is gone, and autograd drops the
hook with it. Arguments are named as ``input`` rows are (``in.x``, ``in.mask``); tensors nested
inside an argument (a tuple of tensors) are left as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from torch import Tensor, nn

from layerscope.hooks._cost import CostMeter
from layerscope.hooks._handles import HookHandles, in_backward
from layerscope.hooks._steps import StepClock
from layerscope.hooks._values import InputNames
from layerscope.model import Kind
from layerscope.recording import Recorder, Target

TRAIN = "train"
Hook = Callable[[str, Tensor], None]


def hooked_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: InputNames, on_grad: Hook
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``(args, kwargs)`` with each tensor that needs a gradient as a hooked view of itself.

    ``on_grad(name, grad)`` gets the gradient through the module of the input called
    ``name``. None where no argument needs a gradient: the call goes on as it was.

    Examples:
        >>> import torch
        >>> seen = {}
        >>> x = torch.ones(2, requires_grad=True)
        >>> args, kwargs = hooked_inputs((x,), {}, InputNames(nn.Tanh()), seen.__setitem__)
        >>> args[0] is x, torch.equal(args[0], x)
        (False, True)
        >>> (args[0] * 3).sum().backward()
        >>> seen["in.input"]
        tensor([3., 3.])
    """
    hooked_args = list(args)
    hooked_kwargs = dict(kwargs)
    changed = False
    for index, value in enumerate(args):
        if _needs_grad(value):
            hooked_args[index] = _hooked(value, f"in.{names.name_at(index)}", on_grad)
            changed = True
    for key, value in kwargs.items():
        if _needs_grad(value):
            hooked_kwargs[key] = _hooked(value, f"in.{key}", on_grad)
            changed = True
    return (tuple(hooked_args), hooked_kwargs) if changed else None


def _needs_grad(value: object) -> bool:
    return isinstance(value, Tensor) and value.requires_grad


def _hooked(tensor: Tensor, name: str, on_grad: Hook) -> Tensor:
    view = tensor.view_as(tensor)
    view.register_hook(partial(on_grad, name))  # type: ignore[no-untyped-call]  # untyped in torch
    return view


class InputGradients:
    """The watched modules' pre-hooks that hook their inputs, on recorded steps only.

    Args:
        targets: the watched modules.
        clock: steps and gates.
        recorder: where readings go.
        meter: the training thread's cost.
        fail: counts and warns of a monitoring failure.
        call_of: the index of a module's call now under way in the training pass.
    """

    def __init__(
        self,
        targets: Sequence[tuple[Target, nn.Module]],
        clock: StepClock,
        recorder: Recorder,
        meter: CostMeter,
        fail: Callable[[str, BaseException], None],
        call_of: Callable[[str], int],
    ) -> None:
        names = InputNames.cache()  # each forward's signature read once, here
        self._targets = [(target, module, names(module)) for target, module in targets]
        self._clock = clock
        self._recorder = recorder
        self._meter = meter
        self._fail = fail
        self._call_of = call_of
        self._handles = HookHandles()

    def sync(self) -> None:
        """Hook the modules while the step records; take the hooks off otherwise."""
        if self._clock.recording and self._targets and not len(self._handles):
            for target, module, names in self._targets:
                hook = partial(self._before, target, module, names)
                self._handles.add(module.register_forward_pre_hook(hook, with_kwargs=True))
        elif not self._clock.recording and len(self._handles):
            self._handles.remove()

    def remove(self) -> None:
        """Take every hook off; gradients of graphs built before are not recorded."""
        self._handles.remove()
        self._targets = []

    def _before(
        self,
        target: Target,
        watched: nn.Module,
        names: InputNames,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        clock = self._clock
        # A checkpointed forward recomputed in backward was hooked the first time.
        if not (clock.recording and clock.training) or module is not watched or in_backward():
            return None
        start = time.perf_counter()
        try:
            on_grad = partial(self._on_grad, target, self._call_of(target.name))
            return hooked_inputs(args, kwargs, names, on_grad)
        except Exception as error:
            self._fail(f"hooking the inputs of {target.name!r}", error)
            return None
        finally:
            self._meter.seconds += time.perf_counter() - start

    def _on_grad(self, target: Target, call: int, name: str, grad: Tensor | None) -> None:
        if grad is None or not self._clock.recording or not len(self._handles):
            return  # also after remove(): a graph built before it may still run backward
        start = time.perf_counter()
        try:
            self._recorder.record(self._clock.step, target, Kind.INPUT_GRAD, name, call, TRAIN,
                                  grad)  # fmt: skip
        except Exception as error:
            self._fail(f"the input gradient hook of {target.name!r}", error)
        finally:
            self._meter.seconds += time.perf_counter() - start
