"""``capture()``'s arguments, checked: errors name the argument and what was expected."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from layerscope._limits import MAX_COUNT, MAX_STEP, Bound, check_within
from layerscope.hooks import parse_optimizers
from layerscope.model import Kind, Selection, check_types, parse_rules
from layerscope.tensors._event import Event
from layerscope.tensors._records import Record
from layerscope.tensors._reductions import Reduction, parse_reduction

KINDS = (Kind.ACTIVATION, Kind.GRAD, Kind.INPUT, Kind.INPUT_GRAD, Kind.WEIGHT_GRAD)


@dataclass(frozen=True, kw_only=True, slots=True)
class CaptureOptions:
    """What a capture keeps, of which modules, and when."""

    selection: Selection
    kinds: frozenset[Kind]
    condition: Callable[[Record], object] | None
    reduction: Reduction | None
    stash_value: Callable[[Tensor], Any] | None
    every: int
    device: torch.device | None
    max_bytes: int | None
    stash: Callable[[Event], Any] | None = None
    optimizers: tuple[torch.optim.Optimizer, ...] = ()
    whole_outputs: bool = False

    @classmethod
    def from_arguments(
        cls,
        *,
        include: object,
        exclude: object,
        types: object,
        kinds: object,
        condition: object,
        reduction: object,
        stash_value: object,
        every: object,
        device: object,
        max_bytes: object,
        root: nn.Module | None = None,
        stash: object = None,
        optimizer: object = None,
        whole_outputs: object = False,
    ) -> CaptureOptions:
        """Check ``capture()``'s arguments; module objects are found in ``root`` if given."""
        if stash is not None and stash_value is not None:
            raise ValueError(
                "stash, stash_value: give one of them; stash(event) can apply stash_value itself"
            )
        if not isinstance(whole_outputs, bool):
            raise TypeError(f"whole_outputs: expected True or False, got {whole_outputs!r}")
        if whole_outputs and reduction is not None:
            raise ValueError(
                "whole_outputs, reduction: a reduction folds tensors one by one; keep outputs "
                "whole or reduce them, not both"
            )
        return cls(
            selection=Selection(
                include=parse_rules(include, "include", root),
                exclude=parse_rules(exclude, "exclude", root),
                types=check_types(types),
            ),
            kinds=parse_kinds(kinds),
            condition=parse_condition(condition),
            reduction=parse_reduction(reduction),
            stash_value=_callable_or_none(stash_value, "stash_value", "fn(tensor) -> value"),
            every=_int_at_least(every, "every", 1, MAX_STEP),
            device=parse_device(device),
            max_bytes=(
                None if max_bytes is None else _int_at_least(max_bytes, "max_bytes", 0, MAX_COUNT)
            ),
            stash=_callable_or_none(stash, "stash", "fn(event) -> value"),
            optimizers=tuple(parse_optimizers(optimizer)),
            whole_outputs=whole_outputs,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, saved with the capture."""
        return {
            **self.selection.texts(),  # include, exclude, types
            "kinds": sorted(kind.value for kind in self.kinds),
            "condition": self.condition is not None,
            "reduction": None if self.reduction is None else self.reduction.name,
            "stash_value": self.stash_value is not None,
            "stash": self.stash is not None,
            "optimizers": len(self.optimizers),
            "every": self.every,
            "device": None if self.device is None else str(self.device),
            "max_bytes": self.max_bytes,
            "whole_outputs": self.whole_outputs,
        }


def parse_kinds(kinds: object) -> frozenset[Kind]:
    """``kinds``: some of ``activation``, ``grad``, ``input``, ``input_grad``, ``weight_grad``."""
    names = ", ".join(kind.value for kind in KINDS)
    items = (kinds,) if isinstance(kinds, str | Kind) else kinds
    if not isinstance(items, Iterable):
        raise TypeError(f"kinds: expected a tuple of kind names ({names}), got {kinds!r}")
    parsed = set()
    for item in items:
        try:
            kind = Kind(item)
        except ValueError:
            kind = None
        if kind not in KINDS:
            raise ValueError(f"kinds: unknown kind {item!r}; expected some of {names}")
        parsed.add(kind)
    if not parsed:
        raise ValueError(f"kinds: expected at least one of {names}")
    return frozenset(k for k in parsed if k is not None)


def parse_condition(condition: object) -> Callable[[Record], object] | None:
    """``condition``: None, or a callable taking one argument (the Record to be kept)."""
    checked: Callable[[Record], object] | None = _callable_or_none(
        condition, "condition", "fn(record) -> bool"
    )
    if checked is None:
        return None
    try:
        signature = inspect.signature(checked)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return checked
    try:
        signature.bind(None)
    except TypeError:
        raise TypeError(
            f"condition: expected a callable taking one argument, the record (its metadata "
            f"and the live tensor), got one with signature {signature}; write "
            f"lambda record: ... to ignore it"
        ) from None
    return checked


def parse_device(device: object) -> torch.device | None:
    """``device``: where kept values go; None keeps each on its own device."""
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device: expected a device name or torch.device, got {device!r}")
    try:
        parsed = torch.device(device)
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"device: {device!r} cannot be used here: {error}") from None
    return parsed


def _callable_or_none(value: object, argument: str, expected: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{argument}: expected a callable {expected}, got {value!r}")
    return value


def _int_at_least(value: object, argument: str, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument}: expected an int >= {least}, got {value!r}")
    if value < least:
        raise ValueError(f"{argument}: expected an int >= {least}, got {value}")
    check_within(value, argument, Bound(least, most))
    return value
