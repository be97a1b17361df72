"""Optimizer updates: the parameters before the step, and after minus before once it is done."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


class UpdateSnapshot:
    """A copy of the parameters taken before an optimizer step, kept for the next one.

    One ``_foreach`` copy into the kept tensors replaces a clone per parameter; the update is
    computed in place in them, so a step of every kind allocates nothing here.
    """

    def __init__(self) -> None:
        self._before: list[Tensor] | None = None
        self._taken = False

    def take(self, params: Sequence[Tensor]) -> None:
        """Copy ``params`` as they are before the step."""
        with torch.no_grad():
            values = [param.detach() for param in params]
            kept = self._before
            if kept is not None and all(map(_same_layout, kept, values)):
                _each(torch._foreach_copy_, Tensor.copy_, kept, values)
            else:  # first use, or a parameter moved, was cast or resized since
                self._before = [value.clone() for value in values]
        self._taken = True

    def updates(self, params: Sequence[Tensor]) -> list[Tensor] | None:
        """``after - before`` of each parameter, or None if no copy was taken this step.

        They stay valid until the next ``take``.
        """
        if not self._taken or self._before is None:
            return None
        self._taken = False
        with torch.no_grad():
            before = self._before
            after = [param.detach() for param in params]
            # -before + after is after - before bit for bit, +0.0 where nothing moved
            # (-(before - after) would make that -0.0)
            _each(torch._foreach_neg_, Tensor.neg_, before)
            _each(torch._foreach_add_, Tensor.add_, before, after)
        return before

    def release(self) -> None:
        """Free the copy: the next step records no update."""
        self._before = None
        self._taken = False


def _each(
    foreach: Callable[..., object], single: Callable[..., object], *lists: list[Tensor]
) -> None:
    """``foreach(*lists)`` on plain tensors, else one ``single`` call per tensor (or pair).

    Tensor subclasses (DTensor and other wrappers) may lack ``_foreach`` kernels.
    """
    if all(type(t) is Tensor for tensors in lists for t in tensors):
        foreach(*lists)
    else:
        for tensors in zip(*lists, strict=True):
            single(*tensors)


def _same_layout(kept: Tensor, value: Tensor) -> bool:
    return (
        kept.shape == value.shape
        and kept.dtype == value.dtype
        and kept.device == value.device
        and kept.stride() == value.stride()
    )
