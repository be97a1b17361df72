"""Hook handles that come off together, and the autograd facts hooks need."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from torch.utils.hooks import RemovableHandle


class HookHandles:
    """Every handle a scope registered, so that ``remove()`` leaves nothing behind."""

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []

    def __len__(self) -> int:
        return len(self._handles)

    def add(self, handle: RemovableHandle) -> None:
        """Keep ``handle`` for removal."""
        self._handles.append(handle)

    def remove(self) -> None:
        """Remove every handle; safe to call twice."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


class ModuleClaims:
    """Modules that an open scope watches, so that a second scope on them is refused.

    A notebook cell run twice would otherwise put a second set of hooks on every module,
    and every row would be recorded twice. The registry holds neither modules nor scopes.
    """

    _owners: ClassVar[weakref.WeakKeyDictionary[Any, weakref.ref[Any]]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, modules: list[Any]) -> None:
        self._modules = [weakref.ref(module) for module in modules]

    @classmethod
    def claim(cls, modules: Iterable[Any], owner: Any) -> ModuleClaims:
        """Claim ``modules`` for ``owner``; ValueError naming ``model`` if one is taken."""
        unique = list({id(module): module for module in modules}.values())
        for module in unique:
            taken = cls._owners.get(module)
            holder = taken() if taken is not None else None
            if holder is not None and holder is not owner:
                raise ValueError(
                    f"model: {type(module).__name__} is already watched by {holder!r}; close "
                    f"that scope first (scope.close(), or leave its with block)"
                )
        for module in unique:
            cls._owners[module] = weakref.ref(owner)
        return cls(unique)

    def release(self) -> None:
        """Give the modules back; safe to call twice."""
        for ref in self._modules:
            module = ref()
            if module is not None:
                self._owners.pop(module, None)
        self._modules = []


def weak_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` as a hook that does not keep its object alive.

    A tensor's hooks are held where Python's garbage collector cannot see them (the tensor
    in C++), so a hook on a parameter that refers back to what holds the parameter makes a
    cycle that is never collected: an unclosed scope would keep its model for good.
    """
    ref = weakref.WeakMethod(method)

    def hook(*args: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args)

    return hook


def in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread.

    A forward hook that fires inside backward is activation checkpointing recomputing the
    forward. ``torch.utils.checkpoint`` asks the same private question.
    """
    task_id: Callable[[], int] | None = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def queue_at_backward_end(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the running backward pass has finished (DDP and FSDP do the same)."""
    engine: Any = torch.autograd.Variable._execution_engine  # private, stable since 1.x
    engine.queue_callback(callback)
