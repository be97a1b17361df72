"""What can be recorded of a module."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Kind(str, Enum):
    """The kinds of tensor layerscope records; plain strings are accepted wherever one is."""

    ACTIVATION = "activation"  # forward output
    INPUT = "input"  # forward input, before the module runs
    GRAD = "grad"  # gradient with respect to the forward output
    INPUT_GRAD = "input_grad"  # gradient with respect to a forward input, through the module
    WEIGHT = "weight"  # parameters after the optimizer step
    WEIGHT_GRAD = "weight_grad"  # parameter gradients, accumulated, before the optimizer step
    UPDATE = "update"  # parameter change made by the optimizer step
    BUFFER = "buffer"  # module buffers (BatchNorm running statistics, ...)

    def __str__(self) -> str:
        return self.value


DEFAULT_KINDS = (Kind.ACTIVATION, Kind.GRAD, Kind.WEIGHT, Kind.WEIGHT_GRAD)

# Kinds read once per step from parameters or buffers: a later reading replaces an earlier one.
# The others come from forward and backward passes: readings of one step merge.
STATE_KINDS = frozenset((Kind.WEIGHT, Kind.WEIGHT_GRAD, Kind.UPDATE, Kind.BUFFER))


def parse_kinds(kinds: object, has_optimizer: bool) -> frozenset[Kind]:
    """``kinds=``: kind names; ``update`` needs an optimizer to know when a step happens."""
    if isinstance(kinds, str | Kind):
        kinds = (kinds,)
    if not isinstance(kinds, Iterable):
        raise TypeError(f"kinds: expected a tuple of kind names, got {kinds!r}")
    parsed = set()
    for item in kinds:
        try:
            parsed.add(Kind(item))
        except ValueError:
            names = ", ".join(kind.value for kind in Kind)
            raise ValueError(f"kinds: unknown kind {item!r}; expected some of {names}") from None
    if Kind.UPDATE in parsed and not has_optimizer:
        raise ValueError(
            "kinds: 'update' needs optimizer=: the change a step makes is read around "
            "optimizer.step()"
        )
    if not parsed:
        raise ValueError("kinds: expected at least one kind")
    return frozenset(parsed)
