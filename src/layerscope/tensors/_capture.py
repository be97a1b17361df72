"""``Capture``: hooks that keep whole tensors of chosen modules, step by step.

A forward hook on each chosen module copies its outputs (and registers a tensor hook on each
output that needs a gradient, for the gradient with respect to it); a forward pre-hook copies
inputs; weight gradients are read at the optimizer's moment (see ``_keeping``). Tensor hooks,
not full backward hooks: those break ``ReLU(inplace=True)``. Copies are made inside the hook,
before a later in-place op can change the tensor. Hooks are plain
closures, so ``copy.deepcopy`` of a model under capture (an EMA copy) copies no capture; the
copy's forward passes are not kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn

from layerscope.hooks import (
    HookHandles,
    InputNames,
    hooked_inputs,
    in_backward,
    named_tensors,
)
from layerscope.model import Kind, html_table, select, unwrap
from layerscope.tensors._keeping import TRAIN, Target, ValueKeeper
from layerscope.tensors._options import CaptureOptions

EVAL = "eval"
# The kinds that hook the modules' passes; weight gradients hook the parameters.
PASS_KINDS = frozenset((Kind.ACTIVATION, Kind.GRAD, Kind.INPUT, Kind.INPUT_GRAD))


class Capture(ValueKeeper):
    """Whole tensors of chosen modules, kept while the capture is open.

    Made by ``layerscope.capture``; see there. A context manager: leaving the ``with`` block,
    or ``close()``, removes every hook, also when the block raised. The records stay.
    """

    def __init__(self, model: nn.Module, options: CaptureOptions) -> None:
        root = unwrap(model)
        targets = [
            Target(name, type(module).__name__, weakref.ref(module))
            for name, module in select(root, options.selection)
        ]
        if not targets:
            raise ValueError(
                f"include/exclude/types: no module of the model is chosen "
                f"(include={options.to_dict()['include']}, "
                f"exclude={options.to_dict()['exclude']}, types={options.to_dict()['types']})"
            )
        super().__init__(options, targets)
        self._root: weakref.ref[nn.Module] | None = weakref.ref(root)
        self._targets: list[Target] = targets
        self._handles = HookHandles()
        self._calls: dict[tuple[str, str, int], int] = {}  # (module, phase, step): calls
        self._sync_hooks()

    # ---------------------------------------------------------------- public

    @property
    def current_step(self) -> int:
        """The step that forward passes now belong to."""
        return self._step

    @property
    def bytes(self) -> int:
        """Bytes of memory the kept values hold."""
        return self._bytes

    @property
    def skipped(self) -> int:
        """Values not kept because ``max_bytes`` was reached (since the capture began)."""
        return self._skipped

    @property
    def failures(self) -> int:
        """Monitoring failures: the first warned once, all were counted, none stopped training."""
        return self._failures.count

    @property
    def hooks(self) -> int:
        """Hooks now on the model's modules and parameters (0 after close)."""
        return len(self._handles) + (0 if self._moments is None else len(self._moments))

    @property
    def closed(self) -> bool:
        """Whether the capture was closed."""
        return self._closed

    @property
    def modules(self) -> list[str]:
        """The qualified names of the modules still captured, in the model's order."""
        return [target.name for target in self._targets]

    def remove(self, module: nn.Module | str | int) -> None:
        """Stop capturing one module; the others go on, and its records so far stay.

        Args:
            module: the module, its qualified name, or its position in ``modules`` (as
                torchfunc's ``recorder.remove(i)`` takes one).

        Examples:
            >>> import torch, layerscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
            >>> cap = layerscope.capture(net, kinds=["activation"])
            >>> cap.modules
            ['0', '1']
            >>> cap.remove(net[0])
            >>> _ = net(torch.ones(1, 2))
            >>> sorted({record.module for record in cap.records})
            ['1']
        """
        if self._closed:
            raise RuntimeError("capture: remove() after close(); the capture is closed")
        target = self._target_of(module)
        self._handles.remove()
        if self._moments is not None:
            self._moments.remove()
        self._targets.remove(target)
        self._forget_weight_grads_of(target.name)
        self._sync_hooks()

    def _target_of(self, module: nn.Module | str | int) -> Target:
        """The captured module ``module`` names; a clear error where it names none."""
        names = self.modules
        if isinstance(module, bool) or not isinstance(module, nn.Module | str | int):
            raise TypeError(
                f"module: expected a module, its qualified name or its position in "
                f"capture.modules, got {type(module).__name__}"
            )
        if isinstance(module, int):
            if not -len(names) <= module < len(names):
                raise IndexError(
                    f"module: position {module} is outside capture.modules ({len(names)} modules)"
                )
            return self._targets[module]
        for target in self._targets:
            if target.name == module or target.module() is module:
                return target
        shown = module if isinstance(module, str) else type(module).__name__
        raise ValueError(f"module: {shown!r} is not among the modules captured: {names}")

    def step(self) -> None:
        """End the step: later forward passes belong to the next one.

        With ``every=N`` only every N-th step keeps values; between them the modules carry no
        hook of the capture at all.
        """
        if self._closed:
            raise RuntimeError("capture: step() after close(); the capture is closed")
        self._keep_weight_grads()
        self._step += 1
        self._calls.clear()
        self._sync_hooks()

    def close(self) -> None:
        """Remove every hook and let go of the model; the records stay. Safe to call twice.

        The weight gradients read in the step in progress are kept first.
        """
        if not self._closed:
            self._keep_weight_grads()
        self._closed = True
        self._handles.remove()
        self._release_weight_grads()
        self._targets = []
        self._root = None
        self._calls.clear()

    def clear(self) -> None:
        """Forget every record; ``max_bytes`` counts from zero again."""
        with self._lock:
            super().clear()
            self._reduced.clear()
            self._bytes = 0
            self._full = False

    def __enter__(self) -> Capture:
        if self._closed:
            raise RuntimeError("capture: a closed capture cannot be entered again")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self._step}"
        return (
            f"Capture({state}, records={len(self._records)}, bytes={self._bytes}, "
            f"hooks={self.hooks})"
        )

    def _repr_html_(self) -> str:
        """A notebook's view: state, records, steps, bytes kept and hooks."""
        state = "closed" if self._closed else f"open, step {self._step}"
        fields = [
            ("state", state),
            ("records", len(self._records)),
            ("bytes kept", self._bytes),
            ("hooks", self.hooks),
        ]
        return html_table("layerscope capture", fields)

    def _info(self) -> dict[str, Any]:
        return {
            "options": self._options.to_dict(),
            "steps": self._step + 1,
            "bytes": self._bytes,
            "skipped": self._skipped,
            "failures": self._failures.count,
        }

    # ---------------------------------------------------------------- hooks

    def _records_step(self) -> bool:
        return self._step % self._options.every == 0

    def _hook_step(self) -> int:
        """The step a forward pass now belongs to."""
        return self._step

    def _sync_hooks(self) -> None:
        wanted = not self._closed and self._records_step()
        if wanted and not self.hooks:
            self._attach()
        elif not wanted and self.hooks:
            self._handles.remove()
            if self._moments is not None:
                self._moments.remove()

    def _attach(self) -> None:
        if self._moments is not None:
            self._moments.attach()
        if not self._options.kinds & PASS_KINDS:
            return
        input_names = InputNames.cache()  # each forward's signature read once
        for target in self._targets:
            module = target.module()
            if module is None:
                continue
            if Kind.INPUT in self._options.kinds:
                hook = self._input_hook(target, input_names(module))
                pre = module.register_forward_pre_hook(hook, with_kwargs=True)
                self._handles.add(pre)
            if Kind.INPUT_GRAD in self._options.kinds:
                hook = self._input_grad_hook(target, input_names(module))
                pre = module.register_forward_pre_hook(hook, with_kwargs=True)
                self._handles.add(pre)
            # Also for inputs alone: it counts the calls.
            output_hook = self._output_hook(target)
            self._handles.add(module.register_forward_hook(output_hook, with_kwargs=True))

    def _input_hook(self, target: Target, names: InputNames) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self._closed or module is not target.module() or in_backward():
                return
            step = self._hook_step()
            if not self._keeps_value_of(step):
                return
            phase = self._phase()
            call = self._calls.get((target.name, phase, step), 0)  # the output hook counts it
            for name, tensor in list(names.named(tuple(args), kwargs)):
                self._offer(target, Kind.INPUT, name, step, phase, call, tensor, args, kwargs)
            self._warn_pending()

        return hook

    def _input_grad_hook(self, target: Target, names: InputNames) -> Callable[..., Any]:
        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
            if self._closed or module is not target.module() or in_backward():
                return None
            step = self._hook_step()
            if not (self._keeps_value_of(step) and torch.is_grad_enabled()):
                return None
            phase = self._phase()
            call = self._calls.get((target.name, phase, step), 0)  # the output hook counts it
            on_grad = partial(self._on_input_grad, target, step, phase, call)
            try:
                return hooked_inputs(tuple(args), kwargs, names, on_grad)
            except Exception as error:
                self._failures.record(f"hooking the inputs of {target.name!r}", error)
                return None

        return hook

    def _on_input_grad(
        self, target: Target, step: int, phase: str, call: int, name: str, grad: Tensor | None
    ) -> None:
        # After close() or remove() a graph built before may still run backward.
        if self._closed or grad is None or target not in self._targets:
            return
        self._offer(target, Kind.INPUT_GRAD, name, step, phase, call, grad)
        self._warn_pending()

    def _output_hook(self, target: Target) -> Callable[..., None]:
        kinds = self._options.kinds

        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            # A checkpointed forward recomputed in backward was kept the first time.
            if self._closed or module is not target.module() or in_backward():
                return
            step = self._hook_step()
            if not self._keeps_value_of(step):
                return
            phase = self._phase()
            key = (target.name, phase, step)
            call = self._calls.get(key, 0)
            self._calls[key] = call + 1
            whole = self._options.whole_outputs and Kind.ACTIVATION in kinds
            if whole and output is not None:
                self._offer(target, Kind.ACTIVATION, "out", step, phase, call, output, args,
                            kwargs, whole=True)  # fmt: skip
            for name, tensor in named_tensors(output, "out"):
                if Kind.ACTIVATION in kinds and not whole:
                    self._offer(
                        target, Kind.ACTIVATION, name, step, phase, call, tensor, args, kwargs
                    )
                # A leaf (a parameter returned as it is) would keep the hook for good.
                if Kind.GRAD in kinds and tensor.requires_grad and not tensor.is_leaf:
                    try:
                        grad_hook = self._grad_hook(target, name, step, phase, call)
                        tensor.register_hook(grad_hook)  # type: ignore[no-untyped-call]  # untyped in torch
                    except Exception as error:
                        self._failures.record(f"hooking the gradient of {target.name!r}", error)
            self._warn_pending()

        return hook

    def _grad_hook(
        self, target: Target, name: str, step: int, phase: str, call: int
    ) -> Callable[[Tensor], None]:
        def hook(grad: Tensor | None) -> None:
            # After close() or remove() a graph built before may still run backward.
            if self._closed or grad is None or target not in self._targets:
                return
            self._offer(target, Kind.GRAD, name, step, phase, call, grad)
            self._warn_pending()

        return hook

    def _phase(self) -> str:
        root = None if self._root is None else self._root()
        training = root is None or root.training
        return TRAIN if training and torch.is_grad_enabled() else EVAL
