"""Streaming reductions: one running tensor per (module, kind, tensor), whatever the steps.

``sum`` and ``mean`` accumulate in at least float32 (int64 for sums of integers or bools), so
a long run of float16 or bfloat16 values does not lose its total; ``max`` and ``min`` keep the
values' own dtype. ``mean`` is a running mean: ``mean += (value - mean) / count``. A callable
``fn(accumulated, new) -> Tensor`` gets the running tensor and the new one (detached, on the
capture's device) and returns the next running tensor, as ``functools.reduce`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from layerscope.tensors._records import is_compact, kept_copy

REDUCTIONS = ("sum", "mean", "max", "min")


@dataclass(frozen=True, slots=True)
class Reduction:
    """A named reduction, or a callable one (``name == "callable"``)."""

    name: str
    function: Callable[[Tensor, Tensor], Tensor] | None = None

    def accumulator_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype of the running tensor for values of ``dtype``."""
        if self.name not in ("sum", "mean"):
            return dtype
        if dtype.is_floating_point or dtype.is_complex:
            low = torch.complex64 if dtype.is_complex else torch.float32
            return torch.promote_types(dtype, low)
        return torch.int64 if self.name == "sum" else torch.float32

    def start(self, value: Tensor, device: torch.device | None) -> Tensor:
        """The running tensor after its first value."""
        return kept_copy(value, device, self.accumulator_dtype(value.dtype))

    def fold(
        self, accumulated: Tensor, value: Tensor, count: int, device: torch.device | None
    ) -> Tensor:
        """The running tensor after ``value``, its ``count``-th value (in place for built-ins).

        ``value`` is never changed: it may be the model's own tensor.
        """
        new = value.detach().to(accumulated.device if device is None else device)
        if self.function is not None:
            result = self.function(accumulated, new)
            if not isinstance(result, Tensor):
                raise TypeError(
                    f"reduction: expected a function returning a Tensor, got "
                    f"{type(result).__name__}"
                )
            result = result.detach()
            if _shares_storage(result, new) or not is_compact(result):
                result = kept_copy(result, device)
            return result
        if new.shape != accumulated.shape:
            raise ValueError(
                f"reduction: the tensor's shape changed from {tuple(accumulated.shape)} to "
                f"{tuple(new.shape)}; map it to a fixed shape with stash_value"
            )
        if self.name == "sum":
            accumulated.add_(new)
        elif self.name == "mean":
            # A new tensor, divided in place: ``new`` may be the model's own.
            accumulated.add_(torch.sub(new.to(accumulated.dtype), accumulated).div_(count))
        elif self.name == "max":
            torch.maximum(accumulated, new, out=accumulated)
        else:
            torch.minimum(accumulated, new, out=accumulated)
        return accumulated


def _shares_storage(a: Tensor, b: Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def parse_reduction(reduction: object) -> Reduction | None:
    """``reduction``: None, one of ``REDUCTIONS``, or a callable of two tensors."""
    if reduction is None:
        return None
    if isinstance(reduction, str):
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"reduction: expected one of {', '.join(REDUCTIONS)} or a callable "
                f"fn(accumulated, new), got {reduction!r}"
            )
        return Reduction(reduction)
    if callable(reduction):
        return Reduction("callable", reduction)
    raise TypeError(
        f"reduction: expected a name ({', '.join(REDUCTIONS)}) or a callable "
        f"fn(accumulated, new), got {type(reduction).__name__}"
    )
