"""What a capture keeps: one ``Record`` per tensor, its value a compact detached copy."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# The fields that say which tensor a record holds, in the order frames and files show them.
METADATA = ("module", "type", "kind", "tensor", "step", "phase", "call", "count")


@dataclass(kw_only=True, slots=True, eq=False)
class Record:
    """One tensor kept by ``layerscope.capture``.

    Attributes:
        module: the module's qualified name (``named_modules()``; ``""`` is the root).
        type: the module's class name, e.g. ``"Linear"``.
        kind: ``"activation"`` (forward output), ``"grad"`` (gradient with respect to the
            forward output), ``"input"`` (forward input), ``"input_grad"`` (gradient with
            respect to a forward input, through the module), ``"weight_grad"`` (a parameter's
            gradient as the optimizer sees it) or ``"weight"``.
        tensor: the tensor inside the output or input, or the parameter: ``out``, ``out.0``,
            ``out.logits``, ``in.0``, ``in.mask``, ``weight``.
        step: the step of the forward pass it comes from (a gradient has its forward's).
        phase: ``"train"`` where the model was in training mode with grad enabled, else
            ``"eval"``.
        call: 0 for the module's first call in the step and phase, 1 for the next, ...
        value: the tensor: detached, a compact copy (never a view of a larger storage); or
            what ``stash_value`` or ``stash`` returned (a float, a tuple, ...), each tensor in
            a tuple, list or dict of it such a copy.
        count: how many tensors ``value`` reduces (1 without a ``reduction``).
        whole: ``value`` is a module's whole output, kept as the module returned it
            (``capture(whole_outputs=True)``): a structure whose tensors are named from
            ``tensor`` as records of them would be (``out.0``, ``out.logits``).
    """

    module: str
    type: str
    kind: str
    tensor: str
    step: int
    phase: str
    call: int
    value: Any
    count: int = 1
    whole: bool = False

    def metadata(self) -> dict[str, str | int]:
        """Every field but ``value``, as a dict."""
        return {name: getattr(self, name) for name in METADATA}

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in METADATA)
        value = self.value
        if not isinstance(value, Tensor):
            return f"Record({fields}, value={reprlib.repr(value)})"
        dtype = str(value.dtype).removeprefix("torch.")
        return f"Record({fields}, value=<{dtype} {tuple(value.shape)}>)"


def kept_copy(
    tensor: Tensor, device: torch.device | None, dtype: torch.dtype | None = None
) -> Tensor:
    """A detached, contiguous copy of ``tensor`` with a storage of its own and no larger.

    A slice of a batch's output is a view that holds the whole batch's storage; this copies
    only its elements. ``device`` None keeps the tensor's own device.

    Examples:
        >>> import torch
        >>> row = torch.zeros(1000, 10)[3]
        >>> copy = kept_copy(row, torch.device("cpu"))
        >>> copy.untyped_storage().nbytes(), row.untyped_storage().nbytes()
        (40, 40000)
    """
    source = tensor.detach().resolve_conj().resolve_neg()
    return source.to(
        device=source.device if device is None else device,
        dtype=source.dtype if dtype is None else dtype,
        copy=True,
        memory_format=torch.contiguous_format,
    )


def is_compact(value: Tensor) -> bool:
    """Whether ``value`` is contiguous and its storage holds nothing but its elements."""
    return (
        value.is_contiguous()
        and value.storage_offset() == 0
        and value.untyped_storage().nbytes() == value.numel() * value.element_size()
    )


def kept_bytes(value: Tensor) -> int:
    """Bytes of memory ``value`` keeps: its whole storage."""
    return int(value.untyped_storage().nbytes())
