"""Hook handles that come off together, and the autograd facts hooks need."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
