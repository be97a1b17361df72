"""``update_ratio`` from an adaptive optimizer's rate: a step that may move a weight by its size.

Adam and its kin move each element by about the learning rate whatever its gradient (exactly
the rate at their first step), so ``lr / rms(weight)`` before the step bounds the update
ratio without ``update`` being recorded. A weight matrix whose RMS is below the rate can be
overwritten by a single step: the rate is far too high. It is seen at the first recorded step,
before the large steps have grown the weights; later the measured ratio falls back, as the
weights become the sum of the updates. So where the rate rose since the last recorded step
(a schedule that jumps), the weight is judged at its size then, when it was smaller: the
steps at the new rate grew it. Matrices that start near zero (under a tenth of the
median matrix's RMS at that step: LoRA's B, a projection initialised to zero) are left out:
their first steps are as large as they are, by design.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from torch import Tensor

from layerscope.health._alert import Alert
from layerscope.health._readings import Flush, Reading
from layerscope.health._small_ops import take

Pair = tuple[str, str]  # (module, tensor)

# Above this, one step may move each element of the weight by more than the weight's RMS.
LIMIT = 1.0
_NEAR_ZERO = 0.1  # of the median matrix's RMS: a matrix that starts near zero


class RateNote(Protocol):
    """What the training thread notes of a recorded step (``hooks.RateBounds``)."""

    @property
    def pairs(self) -> Sequence[Pair]: ...
    @property
    def optimizer(self) -> Sequence[str]: ...
    @property
    def rates(self) -> Sequence[float]: ...
    @property
    def norms(self) -> Sequence[Tensor]: ...
    @property
    def sizes(self) -> Sequence[int]: ...


class Bound(NamedTuple):
    """How far one step of ``optimizer`` at ``rate`` may move a weight of RMS ``rms``.

    ``before``: the step, rate and RMS of the last recorded step, where the rate rose since:
    the weight is judged at the smaller of its two sizes, since steps at the new rate grow it.
    """

    optimizer: str
    rate: float
    rms: float
    before: tuple[int, float, float] | None = None

    @property
    def size(self) -> float:
        """The RMS the rate is judged against."""
        return self.rms if self.before is None else min(self.rms, self.before[2])

    @property
    def ratio(self) -> float:
        """The rate against the weight's RMS: the largest update ratio the step allows."""
        return self.rate / self.size

    def alert(self, weight: Reading, module_type: str, rule: str) -> Alert:
        """The alert of ``weight``'s row (of a ``module_type``): what was seen, what to try."""
        name = weight.module or "the model"
        size = f"its RMS ({self.rms:.3g}) before the step"
        if self.before is not None and self.before[2] < self.rms:
            step, rate, rms = self.before
            size = (
                f"its RMS at step {step} ({rms:.3g}), when the rate was {rate:g} ({self.rms:.3g} "
                f"now, grown since)"
            )
        return Alert.on(
            weight,
            rule=rule,
            kind="update",
            value=self.ratio,
            threshold=LIMIT,
            message=f"update ratio of {name} ({module_type}) {weight.tensor} at step "
            f"{weight.step}: {self.optimizer} at lr={self.rate:g} moves each of its elements by "
            f"up to {self.rate:g} a step, {self.ratio:.3g} times {size}: one step can "
            f"overwrite it, a rate far too high. Updates near 1e-3 of the weight are the rule "
            f"of thumb: try lr near {self.size * 1e-2:.1g}, or a warm-up",
        )


class RateBounds:
    """The notes of the training thread, by step, read once each on the writer thread."""

    def __init__(self, matrices: frozenset[Pair], pairs: Sequence[Pair]) -> None:
        self._matrices = matrices
        self.pairs = pairs  # the (module, tensor) of each id the rows hold
        self._lock = threading.Lock()
        self._pending: dict[int, RateNote] = {}
        self._last: dict[Pair, tuple[int, float, float]] = {}  # (step, rate, RMS) last noted

    def note(self, step: int, note: RateNote) -> None:
        """Take the note of recorded ``step`` (any thread)."""
        with self._lock:
            self._pending[step] = note

    def over(self, step: int) -> dict[Pair, Bound]:
        """The weight matrices whose bound at ``step`` is over ``LIMIT``; the note is let go."""
        with self._lock:
            note = self._pending.pop(step, None)
            for older in [s for s in self._pending if s < step]:
                del self._pending[older]  # a step with no rows: nothing will ask
        if note is None:
            return {}
        bounds = {}
        for pair, optimizer, rate, norm, size in zip(
            note.pairs, note.optimizer, note.rates, note.norms, note.sizes, strict=True
        ):
            if pair in self._matrices:
                rms = float(norm) / math.sqrt(max(size, 1))
                last = self._last.get(pair)
                rose = last is not None and rate > last[1]
                bounds[pair] = Bound(optimizer, rate, rms, last if rose else None)
                self._last[pair] = (step, rate, rms)
        sizes = [bound.rms for bound in bounds.values() if bound.rms > 0]
        if not sizes:
            return {}
        near_zero = _NEAR_ZERO * statistics.median(sizes)
        return {
            pair: bound
            for pair, bound in bounds.items()
            if bound.rms > near_zero and bound.ratio > LIMIT
        }


def rate_findings(
    bounds: RateBounds, flush: Flush, weights: Tensor, keys: Tensor, view: Tensor, measured: Tensor
) -> list[tuple[int, int, int, Bound]]:
    """``(view, row, key, bound)`` of each weight row over its bound, in the flush's order.

    ``weights`` are the flush's weight rows, ``keys`` their (module, tensor) ids, ``view``
    their views, ``measured`` whether an ``update`` row measures the step itself: the bound
    is for the rows without. A step whose optimizer step was skipped moved nothing: it is not
    judged.
    """
    pairs = bounds.pairs
    over_bound = []
    for number, at in enumerate(flush.views):
        if not at.judged or at.skipped:
            continue
        over = bounds.over(at.step)
        if not over:
            continue
        rows = ((view == number) & ~measured).nonzero().flatten()
        for position, key in zip(rows.tolist(), take(keys, rows).tolist(), strict=True):
            bound = over.get(pairs[key])
            if bound is not None:
                over_bound.append((number, int(weights[position]), key, bound))
    return over_bound
