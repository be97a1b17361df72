"""Whether a loss that has not fallen shows targets that do not follow the inputs.

Early on, a classifier's loss at chance has two readings: a model that cannot tell its
inputs apart yet (its output the same for every sample: a deep stack's plateau, left once
the signal reaches the head) and one that can, stepped at its full rate, whose loss does not
move because its targets do not follow its inputs (labels shuffled against them). The second
is told apart by three readings together: the loss started at chance, ``ln`` of the output's
width (a classifier's cross-entropy at its first steps); the output varies from sample to
sample (``hooks.OutputSpread``, noted on recorded steps); and the optimizer's rate has not risen
since the first recorded step (no warm-up still under way; the rates of Adam's family, noted
on recorded steps). Anything else, or a reading missing, keeps the early finding a note.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import torch

# Below this spread the output is about the same for every sample: a plateau. A deep ReLU
# stack on its plateau measures under 0.001; a model of the same digits that learns, or
# that cannot because its labels are shuffled, 0.2 and above.
SPREAD = 0.05
CHANCE = 0.1  # a start within this fraction of ln(width) is at chance
_RISEN = 1e-6  # a rate this much above its first has risen
_KEPT = 64  # recorded steps' notes kept: more than a flush falls behind the training thread


class NoSignal:
    """The readings that tell targets that do not follow the inputs from a plateau."""

    def __init__(self) -> None:
        # Notes of recorded steps, the latest last: the training thread notes a step as it
        # runs, while the writer judges a loss some steps behind it, against the notes of
        # its step and before. (step, spread: a 0-d tensor read here, the output's width);
        # (step, the highest rate of the optimizers noted).
        self._outputs: deque[tuple[int, torch.Tensor, int]] = deque(maxlen=_KEPT)
        self._rates: deque[tuple[int, float]] = deque(maxlen=_KEPT)
        self._first: tuple[int, float] | None = None  # the first step's highest rate

    def note_output(self, step: int, spread: torch.Tensor, width: int) -> None:
        """The spread of the model's output at recorded ``step`` (training thread)."""
        self._outputs.append((step, spread, width))

    def note_rates(self, step: int, rates: Sequence[float]) -> None:
        """The learning rates an optimizer steps with at recorded ``step`` (training thread)."""
        if not rates:
            return
        top = max(rates)
        first = self._first  # a tuple assigned whole: the writer reads one or the other
        if first is None or first[0] == step:
            self._first = (step, top if first is None else max(top, first[1]))
        self._rates.append((step, top))

    def shown(self, start: float, step: int) -> str | None:
        """What shows, by ``step``, that the targets do not follow the inputs, if anything.

        ``start``: the loss at its first steps.
        """
        outputs = [noted for noted in list(self._outputs) if noted[0] <= step]
        rates = [(at, top) for at, top in list(self._rates) if at <= step]  # in step order
        if not outputs or not rates or self._first is None:
            return None
        latest = max(top for at, top in rates if at == rates[-1][0])
        spread_step, spread_tensor, width = outputs[-1]
        spread = float(spread_tensor)
        if width < 2 or not math.isfinite(spread):
            return None
        chance = math.log(width)
        first_step, first = self._first
        if abs(start - chance) > CHANCE * chance or spread < SPREAD:
            return None
        if latest > first * (1 + _RISEN) or latest <= 0:
            return None  # a warm-up, the rate still rising; or no step at all
        return (
            f"its targets do not follow its inputs as far as it can tell: it started at chance "
            f"(ln {width} = {chance:.4g} for {width} outputs), its output varies from sample to "
            f"sample (a spread of {spread:.2f} at step {spread_step}; a plateau's is under "
            f"{SPREAD:g}) and its rate has not risen since step {first_step}"
        )
