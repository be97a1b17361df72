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
"""

from __future__ import annotations

import math
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
from layerscope.health._keyed import followed
from layerscope.health._readings import Flush, Reading
from layerscope.health._small_ops import counts_by, take

_KINDS = {"grad": "output", "weight_grad": "parameter"}
_ABSOLUTE = ("weight_grad",)  # the kinds with absolute bounds: those in the optimizer's units


class Gradients:
    """Both rules over each step's gradients (``grad`` and ``weight_grad``).

    Options: ``vanishing_below`` (1e-9), ``exploding_above`` (1e3): absolute bounds on
    parameter gradients; ``relative`` (1e3: that many times below or above the median of the
    layers after it); ``steps`` (2 recorded steps in a row).
    """

    name = "gradients"
    rules = ("vanishing_grad", "exploding_grad")
    defaults: ClassVar[dict[str, Any]] = {
        "vanishing_below": 1e-9,
        "exploding_above": 1e3,
        "relative": 1e3,
        "steps": 2,
    }

    def __init__(
        self,
        codes: Codes,
        vanishing_below: float,
        exploding_above: float,
        relative: float,
        steps: float,
        enabled: tuple[str, ...] = rules,
    ) -> None:
        self._codes = codes
        self._low = vanishing_below
        self._high = exploding_above
        self._relative = relative
        self._enabled = enabled
        # Keyed by (module, kind, tensor) id.
        self._episodes = {
            rule: Episodes(patience=int(steps), recovery=int(steps)) for rule in enabled
        }

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
        # Each (kind, step) group's layers in forward order; a tie keeps the rows' order.
        views = len(flush.views)
        group = torch.cat([take(flush.view, outputs), take(flush.view, weights.flatten()) + views])
        place = take(self._codes.forward_ranks(), take(flush.field(MODULE), rows))
        key = group * (int(place.max()) + 1) + place
        if not bool((key[1:] >= key[:-1]).all()):  # rows mostly come in that order already
            order = key.argsort(stable=True)
            rows, group = take(rows, order), take(group, order)
        size = torch.bincount(group)
        start = size.cumsum(0) - size
        position = torch.arange(len(rows)) - take(start, group)
        size = take(size, group)
        scales = take(flush.rms, rows)
        chosen = self._chosen(flush, rows, scales, position, size)
        return self._judged(flush, rows, group, views, start, size, chosen)

    def _chosen(
        self, flush: Flush, rows: Tensor, scales: Tensor, position: Tensor, size: Tensor
    ) -> Tensor:
        """The layers that may cross a bound, or whose episode may go on or end."""
        low, high = median_bounds(scales, position, size)
        relative = (scales / low > self._relative) | (scales / high < 1 / self._relative)
        absolute = (take(flush.field(KIND), rows) == WEIGHT_GRAD) & (
            (scales < self._low) | (scales > self._high)
        )
        slots = take(flush.field(SLOT), rows)
        count = len(self._codes.slots.values)
        active = set().union(*(episodes.active() for episodes in self._episodes.values()))
        return followed(slots, relative | absolute, active, count)

    def _judged(
        self,
        flush: Flush,
        rows: Tensor,
        group: Tensor,
        views: int,
        start: Tensor,
        size: Tensor,
        chosen: Tensor,
    ) -> list[Found]:
        picked = chosen.nonzero().flatten()
        by_group: dict[int, list[int]] = {}
        for at in picked.tolist():
            by_group.setdefault(int(group[at]), []).append(at)
        found: list[Found] = []
        for number, members in sorted(by_group.items()):
            first = int(start[number])
            scales = take(flush.rms, rows[first : first + int(size[first])]).tolist()
            places = [at - first for at in members]
            kind, view = divmod(number, views)  # kind 0: outputs' gradients, 1: parameters'
            medians = medians_after(scales, places)
            for at, place in sorted(zip(members, places, strict=True), key=lambda x: -x[1]):
                row = int(rows[at])
                layers = len(scales) - 1 - place
                found += [
                    (view, (kind, -place, index), alert)
                    for index, alert in enumerate(
                        self._judge(flush, view, flush.reading(row), medians[place], layers)
                    )
                ]
        return found

    def _judge(
        self, flush: Flush, view: int, reading: Reading, median: float, layers: int
    ) -> list[Alert]:
        found = []
        rms = reading.rms
        compare = layers >= 2  # the layers after it, of which there are ``layers``
        for rule in self._enabled:
            vanishing = rule == "vanishing_grad"
            bound = self._low if vanishing else self._high
            absolute = reading.kind in _ABSOLUTE and (rms < bound if vanishing else rms > bound)
            ratio = rms / median
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
