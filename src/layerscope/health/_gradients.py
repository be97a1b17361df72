"""``vanishing_grad`` and ``exploding_grad``: gradients far too small or too large.

A gradient's scale is its root mean square, so layers of different sizes compare. A layer is
out of bounds relative to the layers after it (nearer the loss, where gradients come from) of
the same kind at that step: ``relative`` times below or above their median (a deep sigmoid
stack's first layers, a badly initialised stack's). A parameter's gradient is also out of
bounds absolutely (``vanishing_below``, ``exploding_above``); an output's is not, as its units
are the loss's as backward saw it: scaled by a GradScaler (65,536 at first) and read before
the scaler unscales, summed or averaged over the batch. Parameter gradients are read where the
optimizer reads them, unscaled. A step with a non-finite gradient is left to the ``nonfinite``
rule (a step GradScaler skipped: its finite gradients are scaled too), and exactly zero
gradients to the ``dead`` rule (no gradient flows through dead units).

"After it" is the order modules return in the logged call order; a module that order lacks
(never called as a module: ``nn.MultiheadAttention``'s ``out_proj``) is judged alone. An
output gradient is also judged against its own last recorded steps: read before clipping, it
shows a loss multiplied up that clipping hides from the parameters' gradients. Only its growth
beyond the most that any layer after it grew counts, so the layer where it starts is named,
not every layer upstream that grows with it. Healthy runs stay below 4 there; ``growth`` at
once is a loss multiplied up, ``climb`` at ``steps`` recorded steps in a row, rising at each,
a gradient that feeds itself (an LSTM stepped too far, its backward through time growing
from step to step, whose gradients then vanish once its gates saturate). A GradScaler's
scale only halves at a skipped step and doubles at most once per growth interval (2,000
steps by default): far below ``climb`` over the ``RECENT`` steps a layer is judged against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from layerscope.health._after_medians import median_bounds, medians_after
from layerscope.health._alert import Alert, Found
from layerscope.health._codes import (
    FIRST_CALL,
    GRAD,
    IS_WEIGHT,
    KIND,
    MODULE,
    SLOT,
    WEIGHT_GRAD,
    Codes,
)
from layerscope.health._episodes import Episodes
from layerscope.health._histories import RecentScales
from layerscope.health._keyed import followed
from layerscope.health._readings import Flush, Reading
from layerscope.health._small_ops import counts_by, put, take

_KINDS = {"grad": "output", "weight_grad": "parameter"}
_ABSOLUTE = ("weight_grad",)  # the kinds with absolute bounds: those in the optimizer's units
RECENT = 8  # recorded steps of a layer's output gradient that say what its scale usually is
MIN_HISTORY = 1  # the fewest of them that do
# The fewest to judge a jump ``growth`` at once against. One earlier step is no usual scale
# for that: a head's first steps grow its input's gradient as fast as its weights grow from
# their initial values (a CNN stepped ten times too high, whose ReLUs then die). A climb is
# judged from one: it must go on rising for ``steps`` recorded steps.
AT_ONCE_HISTORY = 2


@dataclass(frozen=True, slots=True)
class Growth:
    """By row: its growth over its usual scale, beyond the layers' after it, steps held.

    And whether its scale is above its scale at the recorded step before: ``rising``.
    """

    growth: Tensor
    excess: Tensor
    held: Tensor
    rising: Tensor

    def of(self, at: int) -> tuple[float, float, int, bool]:
        """Row ``at``'s four, as Python numbers."""
        growth, excess = float(self.growth[at]), float(self.excess[at])
        return growth, excess, int(self.held[at]), bool(self.rising[at])


class Gradients:
    """Both rules over each step's gradients (``grad`` and ``weight_grad``).

    Options: ``vanishing_below`` (1e-9), ``exploding_above`` (1e3): absolute bounds on
    parameter gradients; ``relative`` (1e3: that many times below or above the median of the
    layers after it); ``steps`` (2 recorded steps in a row); ``growth`` (50: an output
    gradient that many times its median over its last ``RECENT`` recorded steps, beyond the
    most any layer after it grew, explodes at once: the next recorded step may be a hundred
    steps later); ``climb`` (5: that growth at ``steps`` recorded steps in a row, each
    scale larger than the one before, explodes).
    """

    name = "gradients"
    rules = ("vanishing_grad", "exploding_grad")
    defaults: ClassVar[dict[str, Any]] = {
        "vanishing_below": 1e-9,
        "exploding_above": 1e3,
        "relative": 1e3,
        "steps": 2,
        "growth": 50.0,
        "climb": 5.0,
    }

    def __init__(
        self,
        codes: Codes,
        vanishing_below: float,
        exploding_above: float,
        relative: float,
        steps: float,
        growth: float = 50.0,
        climb: float = 5.0,
        enabled: tuple[str, ...] = rules,
    ) -> None:
        self._codes = codes
        self._low = vanishing_below
        self._high = exploding_above
        self._relative = relative
        self._grown_above = growth
        self._climb = climb
        self._steps = int(steps)
        self._enabled = enabled
        # Keyed by (module, kind, tensor) id.
        self._episodes = {
            rule: Episodes(patience=int(steps), recovery=int(steps)) for rule in enabled
        }
        # Growth over a layer's own past: ``climb`` for ``steps`` recorded steps, or
        # ``growth`` at once.
        exploding = "exploding_grad" in enabled
        self._grown = Episodes(patience=int(steps), recovery=int(steps)) if exploding else None
        self._recent = RecentScales(RECENT)
        self._calls = (-1, 0)  # the order's version and module count ``_called_ids`` is of
        self._called_ids = torch.zeros(0, dtype=torch.bool)

    def observe(self, flush: Flush) -> list[Found]:
        """Alerts of a flush's rows: the layers of each step and kind, in forward order."""
        if not len(flush):
            return []
        kind = flush.field(KIND)
        gradient = (kind == GRAD) | (kind == WEIGHT_GRAD)
        spoilt = counts_by(flush.view, gradient & flush.nonfinite, len(flush.views)) > 0
        judged = (
            flush.judged_rows()
            & ~take(spoilt, flush.view)
            & (flush.field(FIRST_CALL) == 1)
            & ~flush.nonfinite
            & (flush.rms > 0)
        )
        outputs = (judged & (kind == GRAD)).nonzero().flatten()
        weights = (judged & (kind == WEIGHT_GRAD) & (flush.field(IS_WEIGHT) == 1)).nonzero()
        rows = torch.cat([outputs, weights.flatten()])
        if not len(rows):
            return []
        # Each (kind, step) group's layers in forward order; a tie keeps the rows' order. A
        # module the call order lacks has no place among them: it is a group of its own.
        views = len(flush.views)
        group = torch.cat([take(flush.view, outputs), take(flush.view, weights.flatten()) + views])
        modules = take(flush.field(MODULE), rows)
        alone = ~take(self._called(), modules)
        group = torch.where(alone, 2 * views + torch.arange(len(rows)), group)
        place = take(self._codes.forward_ranks(), modules)
        key = group * (int(place.max()) + 1) + place
        if not bool((key[1:] >= key[:-1]).all()):  # rows mostly come in that order already
            order = key.argsort(stable=True)
            rows, group = take(rows, order), take(group, order)
        size = torch.bincount(group)
        start = size.cumsum(0) - size
        position = torch.arange(len(rows)) - take(start, group)
        size = take(size, group)
        scales = take(flush.rms, rows)
        growth = self._growth(flush, rows, group)
        chosen = self._chosen(flush, rows, scales, position, size, growth)
        return self._judged(flush, rows, group, start, size, chosen, growth, 2 * views)

    def _called(self) -> Tensor:
        """Which module ids have a place in the forward pass (``ModuleOrder.called``)."""
        order, names = self._codes.order, self._codes.modules.values
        if self._calls != (order.version, len(names)):
            self._calls = (order.version, len(names))
            self._called_ids = torch.tensor([order.called(n) for n in names], dtype=torch.bool)
        return self._called_ids

    def _growth(self, flush: Flush, rows: Tensor, group: Tensor) -> Growth:
        """Each output gradient's growth over its own recent steps, beyond any layer's after it.

        Output gradients are read during backward, before any clipping, so a loss multiplied
        up shows here even where the parameters' gradients are clipped back. Every layer
        upstream of a growing one grows with it: a layer's own growth counts beyond the most
        that any layer after it grew (at least 1), so only the layer where it starts stands out.
        """
        count = len(rows)
        growth = Growth(
            torch.full((count,), math.nan, dtype=torch.float64),
            torch.full((count,), math.nan, dtype=torch.float64),
            torch.zeros(count, dtype=torch.int64),
            torch.zeros(count, dtype=torch.bool),
        )
        outputs = (take(flush.field(KIND), rows) == GRAD).nonzero().flatten()
        view_of = take(flush.view, take(rows, outputs))
        for view in torch.unique(view_of).tolist():  # oldest first: each joins the history
            mine = take(outputs, (view_of == view).nonzero().flatten())
            slots = take(flush.field(SLOT), take(rows, mine))
            scales = take(flush.rms, take(rows, mine))
            usual, held = self._recent.usual(slots)
            usual = usual.where(held >= MIN_HISTORY, math.nan)
            put(growth.growth, mine, scales / usual)
            put(growth.held, mine, held)
            put(growth.rising, mine, scales > self._recent.last(slots))
            self._recent.append(slots, scales)
            # The view's group, in forward order: the most each layer after it grew.
            ranked = mine[take(group, mine) == view]
            grown = take(growth.growth, ranked).nan_to_num(0.0)
            most = grown.flip(0).cummax(0).values.flip(0)
            after = torch.cat([most[1:], torch.zeros(1, dtype=torch.float64)]).clamp(min=1.0)
            put(growth.excess, mine, take(growth.growth, mine))
            put(growth.excess, ranked, grown.where(grown > 0, math.nan) / after)
        return growth

    def _chosen(
        self,
        flush: Flush,
        rows: Tensor,
        scales: Tensor,
        position: Tensor,
        size: Tensor,
        growth: Growth,
    ) -> Tensor:
        """The layers that may cross a bound, or whose episode may go on or end."""
        low, high = median_bounds(scales, position, size)
        relative = (scales / low > self._relative) | (scales / high < 1 / self._relative)
        absolute = (take(flush.field(KIND), rows) == WEIGHT_GRAD) & (
            (scales < self._low) | (scales > self._high)
        )
        least = min(self._climb, self._grown_above)  # the least growth that may open an episode
        grown = (growth.excess > least) if self._grown is not None else relative & False
        slots = take(flush.field(SLOT), rows)
        count = len(self._codes.slots.values)
        episodes = [*self._episodes.values(), *([self._grown] if self._grown else [])]
        active = set().union(*(each.active() for each in episodes))
        return followed(slots, relative | absolute | grown, active, count)

    def _judged(
        self,
        flush: Flush,
        rows: Tensor,
        group: Tensor,
        start: Tensor,
        size: Tensor,
        chosen: Tensor,
        growth: Growth,
        alone_from: int,
    ) -> list[Found]:
        """The alerts of the chosen rows, in the order they are raised.

        By kind, each group's layers from the last to the first, then the layers with no
        place in the forward pass (groups from ``alone_from``), in row order.
        """
        picked = chosen.nonzero().flatten()
        by_group: dict[int, list[int]] = {}
        for at in picked.tolist():
            by_group.setdefault(int(group[at]), []).append(at)
        found: list[Found] = []
        for number, members in sorted(by_group.items()):
            first = int(start[number])
            scales = take(flush.rms, rows[first : first + int(size[first])]).tolist()
            places = [at - first for at in members]
            row = int(rows[first])
            view = int(flush.view[row])
            kind = int(flush.field(KIND)[row] != GRAD)  # 0: outputs' gradients, 1: parameters'
            medians = medians_after(scales, places)
            alone = number >= alone_from
            for at, place in sorted(zip(members, places, strict=True), key=lambda x: -x[1]):
                reading = flush.reading(int(rows[at]))
                layers = len(scales) - 1 - place
                grown = growth.of(at)
                found += [
                    (view, (kind, 1, number, index) if alone else (kind, -place, index), alert)
                    for index, alert in enumerate(
                        self._judge(flush, view, reading, medians[place], layers, grown)
                    )
                ]
        return found

    def _judge(
        self,
        flush: Flush,
        view: int,
        reading: Reading,
        middles: tuple[float, float],
        layers: int,
        grown: tuple[float, float, int, bool],
    ) -> list[Alert]:
        found = self._judge_bounds(flush, view, reading, middles, layers)
        alert = self._judge_growth(flush, view, reading, grown, opened=bool(found))
        return found if alert is None else [*found, alert]

    def _judge_growth(
        self,
        flush: Flush,
        view: int,
        reading: Reading,
        grown: tuple[float, float, int, bool],
        opened: bool,
    ) -> Alert | None:
        """``exploding_grad`` of an output gradient grown far past its own recent scale."""
        if self._grown is None or reading.kind != "grad":
            return None
        growth, excess, held, rising = grown
        # Beyond ``growth`` at once; beyond ``climb`` and still rising at ``steps`` recorded
        # steps in a row (a scale that jumped once and stays is no climb).
        at_once = excess > self._grown_above and held >= AT_ONCE_HISTORY
        climbing = excess > self._climb and rising
        key = self._slot(reading)
        if not self._grown.observe(key, climbing or at_once, at_once) or opened:
            return None
        if key in self._episodes["exploding_grad"].active():
            return None
        name = reading.module or "the model"
        how = (
            f"{excess:.3g} times the most any layer after it grew"
            if at_once
            else f"{excess:.3g} times the most any layer after it grew, beyond {self._climb:g} "
            f"and larger than at the recorded step before, at {self._steps} recorded steps in a "
            "row: a gradient that feeds itself"
        )
        return Alert.on(
            reading,
            rule="exploding_grad",
            value=excess,
            threshold=self._grown_above if at_once else self._climb,
            message=(
                f"exploding gradient at step {flush.views[view].step}: the gradient of {name} "
                f"({self._codes.order.type_of(reading.module)}) output {reading.tensor} (root "
                f"mean square): its scale {reading.rms:.3g} is {growth:.3g} times its median over "
                f"its last {held} recorded steps, {how}. Output gradients are read before "
                "clipping: look for a loss or a loss weight multiplied up, or a learning rate "
                "too high, and clip gradients"
            ),
        )

    def _judge_bounds(
        self, flush: Flush, view: int, reading: Reading, middles: tuple[float, float], layers: int
    ) -> list[Alert]:
        found = []
        rms = reading.rms
        compare = layers >= 2  # the layers after it, of which there are ``layers``
        for rule in self._enabled:
            vanishing = rule == "vanishing_grad"
            bound = self._low if vanishing else self._high
            absolute = reading.kind in _ABSOLUTE and (rms < bound if vanishing else rms > bound)
            ratio = rms / middles[0 if vanishing else 1]  # the middle nearer its own
            relative = compare and (
                ratio < 1 / self._relative if vanishing else ratio > self._relative
            )
            # Hysteresis: back within a tenth of the way (in orders of magnitude) clears it.
            near = math.log10(self._relative) / 2
            clear = not absolute and abs(math.log10(ratio)) < near if compare else not absolute
            holds = True if absolute or relative else (False if clear else None)
            key = self._slot(reading)
            if not self._episodes[rule].observe(key, holds):
                continue
            what = "vanishing" if vanishing else "exploding"
            how = (
                f"its scale {rms:.3g} is {'below' if vanishing else 'above'} {bound:g}"
                if absolute
                else f"its scale {rms:.3g} is {ratio:.2g} times the median of the {layers} "
                "layers after it"
            )
            name = reading.module or "the model"
            found.append(
                Alert.on(
                    reading,
                    rule=rule,
                    value=rms if absolute else ratio,
                    threshold=bound
                    if absolute
                    else (1 / self._relative if vanishing else self._relative),
                    message=(
                        f"{what} gradient at step {flush.views[view].step}: the gradient of "
                        f"{name} ({self._codes.order.type_of(reading.module)}) "
                        f"{_KINDS[reading.kind]} {reading.tensor} (root mean square): {how}"
                    ),
                )
            )
        return found

    def _slot(self, reading: Reading) -> int:
        return self._codes.slots.ids[(reading.module, reading.kind, reading.tensor)]
