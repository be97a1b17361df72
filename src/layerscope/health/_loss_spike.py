"""``loss_spike``: a loss that diverges or jumps, and the layers whose statistics moved first."""

from __future__ import annotations

from typing import Any

from layerscope.health._codes import ACTIVATION, FIRST_CALL, GRAD, KIND, SLOT, Codes
from layerscope.health._histories import Histories
from layerscope.health._loss_judge import LossJudge, Moved
from layerscope.health._readings import Flush
from layerscope.health._small_ops import take


class LossSpike(LossJudge):
    """The scalar ``scalar`` ("loss") climbing away from its recent low, or jumping far above.

    On the log scale, against the last ``window`` values (after ``warmup`` of them): their
    low (the least median of a few in a row, which the fall of the first steps does not
    raise) and their noise (the median absolute deviation of the steps between values). A
    value ``sigmas`` noises above the low is a spike where the loss is diverging (the value
    before was half as far above the low already, this one is the highest since the low and
    ``ratio`` times it) or where it is ``jump`` times the low at once. A jump that falls back
    at the next step is not divergence (a new head, a hard batch). Before ``warmup`` values,
    a loss rising at each of two steps to ``jump`` times its least value so far runs away
    from its start. The alert names the layers whose scale (root mean square of activations
    and gradients) left its usual range earliest in the steps up to the spike: 3 times off
    the few recorded steps before (a jump), or off its scale at the loss's low (a climb).
    Where no recorded step since the low shows one (a sparse schedule), a second alert names
    them at the first recorded step that does, within ``window`` steps. A scalar that is not
    positive is not judged (its window starts again).

    Options: ``scalar`` ("loss"), ``sigmas`` (4), ``ratio`` (1.2), ``jump`` (5),
    ``window`` (20), ``warmup`` (10).
    """

    def __init__(self, codes: Codes, **options: Any) -> None:
        super().__init__(**options)  # LossJudge's
        self._codes = codes
        self._scales = Histories()  # by (module, kind, tensor) id

    def observe(self, flush: Flush) -> None:
        """Keep the layers' scales; the alerts come from the scalars."""
        if not len(flush):
            return
        kind = flush.field(KIND)
        # Activations and output gradients: parameter gradients jump from batch to batch.
        rows = (
            (
                flush.judged_rows()
                & ((kind == ACTIVATION) | (kind == GRAD))
                & (flush.field(FIRST_CALL) == 1)
                & (flush.rms > 0)
            )
            .nonzero()
            .flatten()
        )
        self._scales.append(
            take(flush.field(SLOT), rows),
            take(flush.view, rows),
            take(flush.step, rows),
            take(flush.rms, rows),
            len(flush.views),
            len(self._codes.slots.values),
        )

    def moved_first(self, step: int, since: tuple[int, int]) -> Moved:
        """Layers whose scale moved up to ``step``, earliest first.

        A jump in the window, or a move from its scale at the loss's low (the steps ``since``).
        """
        found = self._scales.moved(step, self._window) + self._scales.moved_since(since, step)
        earliest: dict[int, tuple[int, float]] = {}
        for key, at, size in found:
            earliest[key] = min(earliest.get(key, (at, size)), (at, size))
        # Within a step, as the step computes: the forward pass in its order, then backward.
        moved = sorted(
            earliest.items(), key=lambda item: (item[1][0], self._when(item[0]), item[1][1])
        )
        names = self._codes.slots.values
        return [(names[key], at) for key, (at, _) in moved]

    def _when(self, key: int) -> tuple[int, int]:
        module, kind, _ = self._codes.slots.values[key]
        place = self._codes.order.forward(module)[1]
        return (0, place) if kind == "activation" else (1, -place)
