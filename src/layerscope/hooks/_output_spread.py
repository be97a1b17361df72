"""How much the model's output varies from sample to sample: whether it depends on its input.

A loss that stays where it started has two readings: a model that cannot yet tell its inputs
apart (a deep stack whose signal fades before the head: its output is the same for every
sample, a plateau it leaves once the signal gets through), or one that can, whose targets do
not follow its inputs (labels shuffled against them). The output's spread tells them apart:
the part of its variance that varies across samples, per output unit, over its whole
variance (the rest is each unit's offset, the same for every sample). It is read on recorded
training passes from the model's output (its first strided floating tensor of at least two
dimensions: the logits, a ``ModelOutput``'s too), over at most ``ROWS`` of its rows, on its
device, and goes to the health rules (``not_learning``) as a note with the output's width
(its last dimension: the classes of a classifier); the run stores neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from layerscope.hooks._values import named_tensors

ROWS = 1024  # the output's rows read: its spread does not need more


def output_spread(output: Any) -> tuple[Tensor, int] | None:
    """The spread of ``output``'s first tensor of at least two dimensions, and its width.

    A 0-d tensor on the output's device (no host sync), None where the output has no such
    tensor or fewer than two rows.

    Examples:
        >>> same = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
        >>> spread, width = output_spread(same)
        >>> float(spread), width
        (0.0, 2)
        >>> round(float(output_spread(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))[0]), 6)
        1.0
    """
    tensor = next(
        (
            t
            for _, t in named_tensors(output, "out")
            # Strided tensors only: a nested (jagged) or sparse one has no rows to compare.
            if t.layout == torch.strided
            and not t.is_nested
            and t.is_floating_point()
            and t.dim() >= 2
            and t.shape[-1] > 0
        ),
        None,
    )
    if tensor is None:
        return None
    rows = _first_rows(tensor.detach())
    if len(rows) < 2:
        return None
    with torch.no_grad():
        # In float32 (a copy of at most ROWS rows), centred on the whole mean first: the
        # variance of each unit within the rows is the whole variance less that of the units'
        # means, three contiguous passes where a variance along dim 0 strides (ten times as
        # slow on a CPU).
        values = rows.float()
        centred = values - values.mean()
        whole = centred.pow(2).mean()
        within = whole - centred.mean(dim=0).pow(2).mean()
        # An output the same everywhere (0 / 0) has no spread.
        spread = (within / whole).nan_to_num(0.0).clamp(0, 1)
    return spread.sqrt(), int(tensor.shape[-1])


def _first_rows(tensor: Tensor) -> Tensor:
    """The first ``ROWS`` rows of ``tensor``'s last dimension, copying no more than those.

    Each leading dimension is narrowed to what the rows need first: reshaping a whole
    non-contiguous output (logits transposed back) would copy all of it.
    """
    rows = tensor
    for dim in range(tensor.dim() - 1):
        inner = math.prod(rows.shape[dim + 1 : -1])
        rows = rows.narrow(dim, 0, min(rows.shape[dim], -(-ROWS // max(inner, 1))))
    return rows.reshape(-1, tensor.shape[-1])[:ROWS]


class OutputSpread:
    """The spread of the model's output at the first recorded training pass of each step.

    Args:
        note: takes the step, the spread (a 0-d tensor on the output's device) and the
            output's width, and says whether later steps' are wanted; once it says no (or
            given None), nothing is computed again.
        fail: counts and warns of a monitoring failure.
    """

    def __init__(
        self,
        note: Callable[[int, Tensor, int], bool] | None,
        fail: Callable[[str, BaseException], None],
    ) -> None:
        self._note = note
        self._fail = fail
        self._read_step: int | None = None  # the step whose first training pass was read

    def read(self, output: Any, training: bool, step: int) -> None:
        """Read the model's output as a recorded pass leaves it: a step's first training one."""
        if self._note is None or not training or step == self._read_step:
            return
        self._read_step = step
        try:
            found = output_spread(output)
            if found is not None and not self._note(step, *found):
                self._note = None  # its reader is done: later steps compute nothing
        except Exception as error:
            self._fail("reading the spread of the model's output", error)
