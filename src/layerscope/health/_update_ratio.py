"""``update_ratio``: how much an optimizer step changes each parameter, against its size.

||update|| / ||weight|| near 1e-3 is the rule of thumb for a healthy learning rate. Far below
(``low``), the parameter barely learns; exactly zero, it never changes: it is missing from the
optimizer's parameter groups, or frozen by a zero learning rate. Far above (``high``), the
step is too large. With ``kinds`` including ``"update"`` the ratio is measured; without, an
adaptive optimizer's rate bounds it (``_rate_bound``), a
parameter left out of the optimizer given to ``watch`` has a ratio of exactly zero, and with
no optimizer given, one whose statistics are bit for bit the same at two recorded steps while
a clearly visible gradient flowed and other parameters changed.

A ratio is judged only where an update happened and had something to apply: not at a step
marked skipped (GradScaler skipped the optimizer step, or the loop never steps), not without
an optimizer where no watched parameter changed (a loop that only looks at gradients), and not
for a parameter whose gradient is negligible beside the others' (the bias of a convolution
followed by BatchNorm, zero up to rounding by construction): a step has nothing but rounding
noise to apply to it.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from layerscope.health._alert import Alert, Found
from layerscope.health._codes import FIRST_CALL, KIND, PAIR, UPDATE, WEIGHT, WEIGHT_GRAD, Codes
from layerscope.health._episodes import Episodes
from layerscope.health._keyed import followed, latest
from layerscope.health._rate_bound import RateBounds, RateNote, rate_findings
from layerscope.health._readings import Flush, Reading
from layerscope.health._small_ops import counts_by, pieces, put, put_at, take
from layerscope.health._stalled import StalledParameters, stall_message
from layerscope.health._typical import typical_scales

_SHAPE = ("mean", "std", "min", "max", "absmax", "l2")  # a weight's statistics, compared whole
_VISIBLE = 1e-3  # a gradient this large against its weight moves it past rounding at any lr
# A gradient this far below the step's median parameter gradient is negligible: an SGD step
# that moves the typical parameter by 1e-3 of its size moves this one by about 1e-7 of its
# own, as much as float32's rounding.
_NEGLIGIBLE = 1e-4
# Before ``warmup``, a weight matrix's step this many times ``high`` (80% of the weight) is a
# finding at once: a rate far too high. Healthy recipes come near half of it in their first steps
# (plain SGD at 20 with clipping, on an LSTM: 0.67).
_EARLY = 8.0


class UpdateRatio:
    """||update|| / ||weight|| of each parameter, or its being exactly zero.

    Options: ``low`` (1e-7), ``high`` (0.1), ``steps`` (2 recorded steps in a row),
    ``warmup`` (20). Weight matrices (``matrices``) are judged
    from the first step against eight times ``high``, one recorded step telling: a learning
    rate far too high shows then, before the large steps have grown the weights. Other
    parameters, and a matrix that starts at zero (seen as a weight equal to its update), are
    judged from step ``warmup`` on: a parameter that starts at zero (a bias, a LayerNorm's
    shift, a layer initialised to zero) has updates as large as itself in its first steps,
    as it should. Where the matrices are known, only they are judged too large: a vector's
    relative step (a bias, a norm's gain or shift) is no measure of the rate, since a bias
    that stays near zero by design (a balanced classifier's, started at zero) has Adam steps
    as large as itself at any healthy rate. A
    ratio of exactly zero is judged at once. Nothing is judged at a step with no update
    (marked skipped; without an optimizer, one where no watched parameter changed), nor for a
    parameter whose gradient is below 1e-4 times the median of the step's parameter gradients
    (where ``weight_grad`` is kept).
    """

    name = "update_ratio"
    defaults: ClassVar[dict[str, Any]] = {"low": 1e-7, "high": 0.1, "steps": 2, "warmup": 20}

    def __init__(
        self,
        codes: Codes,
        low: float,
        high: float,
        steps: float,
        warmup: float,
        left_out: frozenset[tuple[str, str]] | None = None,
        matrices: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        self._codes = codes
        self._patience = int(steps)
        # (module, tensor) of the parameters of two dimensions or more; None: not known.
        self._matrices = matrices or frozenset()
        self._matrix = torch.zeros(0, dtype=torch.bool)  # by (module, tensor) id
        self._vectors_spared = matrices is not None  # too large: matrices only
        self._from_zero = torch.zeros(0, dtype=torch.bool)  # by id: seen starting at zero
        self._warmup = warmup
        # Parameters that need a gradient but are in no group of the optimizer watch() was
        # given; None: no optimizer was given, so unchanged weights tell instead.
        self._left_out = left_out
        self._low = low
        self._high = high
        self._episodes = Episodes(patience=int(steps), recovery=int(steps))
        # By (module, tensor) id: each weight's statistics at its last recorded step, if any.
        self._last = torch.zeros((0, len(_SHAPE)), dtype=torch.float64)
        self._known = torch.zeros(0, dtype=torch.bool)
        self._left = torch.zeros(0, dtype=torch.bool)  # by (module, tensor) id: left out
        # Why parameters cannot learn, as the training thread noted it on recorded steps.
        self.stalled = StalledParameters()
        self.bounds = RateBounds(self._matrices, codes.pairs.values)

    def note_stalled(self, step: int, stalled: dict[tuple[str, str], str]) -> None:
        """Take the training thread's note of which parameters cannot learn at ``step``."""
        self.stalled.note(step, stalled)

    def note_rates(self, step: int, note: RateNote) -> None:
        """Take the training thread's note of an adaptive optimizer's rates at ``step``."""
        self.bounds.note(step, note)

    def observe(self, flush: Flush) -> list[Found]:
        """Alerts of a flush's rows: each step's weights joined with their gradients, updates."""
        if not len(flush):
            return []
        size, views = len(self._codes.pairs.values), len(flush.views)
        self._grow(size)
        judged = flush.judged_rows() & (flush.field(FIRST_CALL) == 1)
        kind, pairs = flush.field(KIND), flush.field(PAIR)
        weights = (judged & (kind == WEIGHT)).nonzero().flatten()
        if not len(weights):
            return []
        keys, view = take(pairs, weights), take(flush.view, weights)
        place = view * size + keys  # a (step, parameter) pair's place in the tables below
        grad = take(_rows_at(judged & (kind == WEIGHT_GRAD), flush, size), place)
        update = take(_rows_at(judged & (kind == UPDATE), flush, size), place)
        shapes = torch.stack([take(flush.stats[name], weights) for name in _SHAPE], dim=1)
        # Each weight's statistics before: at its latest earlier step in the flush, or kept.
        last = latest(view, keys, views, size)
        before_view = torch.cat([torch.full((size, 1), -1), last[:, :-1]], dim=1)
        before_view = take(before_view.reshape(-1), keys * views + view)
        in_flush = before_view >= 0
        position = torch.full((views * size,), -1, dtype=torch.int64)
        put(position, place, torch.arange(len(weights)))
        earlier = take(position, (before_view * size + keys).clamp(min=0)).clamp(min=0)
        before = torch.where(in_flush[:, None], take(shapes, earlier), take(self._last, keys))
        known = in_flush | take(self._known, keys)
        same = known & ((before == shapes) | (before.isnan() & shapes.isnan())).all(dim=1)
        self._keep(last[:, -1], position, shapes, size)
        # Without an optimizer, weights that changed tell that the loop updates at all.
        changed = counts_by(view, known & ~same, views) > 0
        skipped = torch.tensor([v.skipped for v in flush.views], dtype=torch.bool)
        ratio = self._ratios(flush, weights, grad, update, take(changed, view) & same)
        typical = take(typical_scales(flush, judged & (kind == WEIGHT_GRAD)), view)
        has_grad = grad >= 0
        grad_at = grad.clamp(min=0)
        negligible = has_grad & (
            take(flush.nonfinite, grad_at) | ~(take(flush.rms, grad_at) > _NEGLIGIBLE * typical)
        )
        step = take(flush.step, weights)
        found, noted = self._stalls(flush, view, weights, keys, update, negligible)
        bounds = rate_findings(self.bounds, flush, weights, keys, view, update >= 0)
        for number, row, key, bound in bounds:
            if any(self._episodes.observe(key, True) for _ in range(self._patience)):
                weight = flush.reading(row)
                alert = bound.alert(weight, self._codes.order.type_of(weight.module), self.name)
                found.append((number, (row,), alert))
        judge = (
            ~take(skipped, view)
            & ~noted
            & ~negligible
            & ~ratio.isnan()
            & ~(
                (ratio > 0)
                & (step < self._warmup)
                & (
                    self._warming(flush, view, keys, update, shapes)
                    | ~(ratio > self._high * _EARLY)
                )
            )
        )
        sized = take(self._matrix, keys) if self._vectors_spared else torch.ones_like(judge)
        out = (ratio < self._low) | ((ratio > self._high) & sized)
        chosen = judge & followed(keys, judge & out, self._episodes.active(), size)
        picked = chosen.nonzero().flatten()
        columns = (
            take(view, picked),
            take(weights, picked),
            take(ratio, picked),
            take(keys, picked),
            take(has_grad, picked),
            take(sized, picked),
        )
        for at in sorted(zip(*(column.tolist() for column in columns), strict=True)):
            found += self._judge(flush, *at)
        return found

    def _ratios(
        self, flush: Flush, weights: Tensor, grad: Tensor, update: Tensor, unchanged: Tensor
    ) -> Tensor:
        """Each weight's ratio; NaN where none is known."""
        l2 = flush.stats["l2"]
        has_update = update >= 0
        update_at = update.clamp(min=0)
        measured = has_update & ~take(flush.nonfinite, update_at)
        if self._left_out is not None:
            left = take(self._left_table(), take(flush.field(PAIR), weights))
            unmeasured = torch.where(left, 0.0, math.nan)
        else:
            # Unchanged whole statistics, while others changed, mean no step where a gradient
            # flowed that a step would not lose in float32's rounding.
            grad_at = grad.clamp(min=0)
            flowing = (
                (grad >= 0)
                & ~take(flush.nonfinite, grad_at)
                & (take(flush.rms, grad_at) > _VISIBLE * take(flush.rms, weights))
            )
            unmeasured = torch.where(flowing & unchanged, 0.0, math.nan)
        weight_l2 = take(l2, weights)
        ratio = torch.where(measured, take(l2, update_at) / weight_l2, unmeasured.double())
        valid = ~take(flush.nonfinite, weights) & (weight_l2 > 0)
        return torch.where(valid, ratio, math.nan)

    def _warming(
        self, flush: Flush, view: Tensor, keys: Tensor, update: Tensor, shapes: Tensor
    ) -> Tensor:
        """Which rows' measured ratios wait for the warm-up: all but matrices not from zero.

        A weight equal to its update was zero before the step; once seen, at that step and
        later ones of the flush and for good after it.
        """
        pairs = self._codes.pairs.values
        if len(self._matrix) != len(pairs):
            self._matrix = torch.tensor(
                [pair in self._matrices for pair in pairs], dtype=torch.bool
            )
            more = len(pairs) - len(self._from_zero)
            self._from_zero = torch.cat([self._from_zero, torch.zeros(more, dtype=torch.bool)])
        at = update.clamp(min=0)
        moved = torch.stack([take(flush.stats[name], at) for name in _SHAPE], dim=1)
        equal = (moved == shapes) | (moved.isnan() & shapes.isnan())
        zero = (update >= 0) & (equal.all(dim=1) | (shapes[:, _SHAPE.index("l2")] == 0))
        views, size = len(flush.views), len(pairs)
        seen = torch.zeros((size, views), dtype=torch.int64)
        put_at(seen, keys, view, zero.long())
        for first, last in pieces(size, views):
            seen[first:last] = seen[first:last].cummax(1).values
        from_zero = take(self._from_zero, keys) | take(seen.view(-1), keys * views + view).bool()
        put(self._from_zero, take(keys, zero.nonzero().flatten()), True)
        return ~take(self._matrix, keys) | from_zero

    def _left_table(self) -> Tensor:
        pairs = self._codes.pairs.values
        if len(self._left) != len(pairs):
            left = self._left_out or frozenset()
            self._left = torch.tensor([pair in left for pair in pairs], dtype=torch.bool)
        return self._left

    def _grow(self, size: int) -> None:
        more = size - len(self._known)
        if more > 0:
            blank = torch.full((more, len(_SHAPE)), math.nan, dtype=torch.float64)
            self._last = torch.cat([self._last, blank])
            self._known = torch.cat([self._known, torch.zeros(more, dtype=torch.bool)])

    def _keep(self, last: Tensor, position: Tensor, shapes: Tensor, size: int) -> None:
        """Keep each weight's statistics at its latest step in the flush."""
        keys = (last >= 0).nonzero().flatten()
        rows = take(position, take(last, keys) * size + keys)
        self._last.index_copy_(0, keys, take(shapes, rows))
        put(self._known, keys, True)

    def _stalls(
        self,
        flush: Flush,
        view: Tensor,
        weights: Tensor,
        keys: Tensor,
        update: Tensor,
        negligible: Tensor,
    ) -> tuple[list[Found], Tensor]:
        """Alerts of the parameters noted as unable to learn, and which rows they cover.

        A noted parameter is left to this, never to the measured ratio: a frozen backbone's
        update is 0 as meant. One whose measured update is not 0 (a hand-written update of a
        frozen parameter), or whose gradient is negligible, is no finding.
        """
        covered = torch.zeros(len(weights), dtype=torch.bool)
        found: list[Found] = []
        pairs, episodes = self._codes.pairs.values, self.stalled.episodes
        for number, at in enumerate(flush.views):
            if not at.judged or at.skipped:
                continue
            stalled, open_keys = self.stalled.at(at.step), episodes.active()
            if not stalled and not open_keys:
                continue
            rows = (view == number).nonzero().flatten()
            for position, key, moved in zip(
                rows.tolist(),
                take(keys, rows).tolist(),
                (_moved(flush, take(update, rows)) | take(negligible, rows)).tolist(),
                strict=True,
            ):
                pair = pairs[key]
                reason = stalled.get(pair)
                if reason is None:
                    if pair in open_keys:
                        episodes.observe(pair, False)
                    continue
                covered[position] = True
                stall = self.stalled.stall(pair, reason)
                if stall is None or moved or not episodes.observe(stall.key, True):
                    continue
                row = int(weights[position])
                weight = flush.reading(row)
                kind = self._codes.order.type_of(weight.module)
                alert = Alert.on(
                    weight,
                    rule=self.name,
                    kind="update",
                    value=0.0,
                    threshold=self._low,
                    severity=stall.severity,
                    message=f"update ratio of {weight.module or 'the model'} ({kind}) "
                    f"{weight.tensor} is 0: "
                    + stall_message(stall, weight.module, kind, weight.tensor, at.step),
                )
                found.append((number, (row,), alert))
        return found, covered

    def _judge(
        self,
        flush: Flush,
        view: int,
        row: int,
        ratio: float,
        key: int,
        has_grad: bool,
        sized: bool,
    ) -> list[Found]:
        """The alert of one row, if its episode says so.

        ``sized``: whether a ratio above ``high`` counts (a matrix's, or any where the matrices
        are not known).
        """
        too_large = sized and ratio > self._high
        holds = ratio < self._low or too_large
        clear = self._low * 10 <= ratio and (ratio <= self._high / 10 or not sized)
        state = True if holds else (False if clear else None)
        early = flush.views[view].step < self._warmup and too_large and ratio > self._high * _EARLY
        times = self._patience if early else 1  # one early finding counts as ``steps``
        if not any(self._episodes.observe(key, state) for _ in range(times)):
            return []
        alert = self._alert(flush.views[view].step, flush.reading(row), ratio, has_grad)
        return [(view, (row,), alert)]

    def _alert(self, step: int, weight: Reading, ratio: float, has_grad: bool) -> Alert:
        name = weight.module or "the model"
        kind = self._codes.order.type_of(weight.module)
        if ratio == 0.0 and not has_grad:
            how = (
                "the optimizer never changes it, and it has no gradient: is it frozen "
                "(requires_grad False) or unused by the forward pass, and meant to be?"
            )
        elif ratio == 0.0:
            how = (
                "the optimizer never changes it although its gradient is not zero: is it in "
                "the optimizer's parameter groups, with a learning rate above zero?"
            )
        elif ratio < self._low:
            how = f"its updates are {ratio:.2g} of its size (below {self._low:g}): it barely learns"
        else:
            how = f"its updates are {ratio:.2g} of its size (above {self._high:g}): steps too large"
        return Alert.on(
            weight,
            rule=self.name,
            kind="update",
            value=ratio,
            threshold=self._low if ratio < self._low else self._high,
            message=f"update ratio of {name} ({kind}) {weight.tensor} at step {step}: {how}",
        )


def _moved(flush: Flush, update: Tensor) -> Tensor:
    """Whether each update row (-1: none) says the parameter changed."""
    measured = update >= 0
    return measured & (take(flush.stats["l2"], update.clamp(min=0)) > 0)


def _rows_at(rows: Tensor, flush: Flush, size: int) -> Tensor:
    """``(views * size,)``: the row of each (view, (module, tensor) id) among ``rows``; -1."""
    table = torch.full((len(flush.views) * size,), -1, dtype=torch.int64)
    at = rows.nonzero().flatten()
    put(table, take(flush.view, at) * size + take(flush.field(PAIR), at), at)
    return table
