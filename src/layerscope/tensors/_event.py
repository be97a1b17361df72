"""``Event``: what ``capture(stash=fn)`` hands ``fn`` for each tensor it could keep."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One tensor as a hook sees it, for ``capture(stash=fn)``: ``fn(event)`` says what to keep.

    Attributes:
        module: the module itself (``type(event.module)`` is tensor_tracker's ``type``).
        name: its qualified name (``named_modules()``; ``""`` is the root).
        kind: ``"activation"``, ``"grad"``, ``"input"``, ``"input_grad"`` or ``"weight_grad"``.
        tensor: the tensor's name inside the output, input or module: ``out``, ``out.0``,
            ``in.mask``, ``weight``.
        step: the capture's step.
        phase: ``"train"`` or ``"eval"``.
        call: 0 for the module's first call in the step and phase, 1 for the next, ...
        value: the tensor, detached, live (not a copy: reading it on a GPU is a host sync;
            return what to keep, not the event).
        args: the positional arguments of the module's call, for activations and inputs;
            ``()`` for gradients, whose hooks run in backward (as tensor_tracker's).
        kwargs: the keyword arguments of that call; ``{}`` for gradients.
    """

    module: nn.Module
    name: str
    kind: str
    tensor: str
    step: int
    phase: str
    call: int
    value: Tensor
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
