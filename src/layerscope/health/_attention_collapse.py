"""``attention_collapse``: a head's attention entropy fallen to a small part of its start.

Entropy collapse (a head putting nearly all its weight on one key, its attention logits grown
large) comes before the loss spikes and divergence of unstable transformer training (Zhai et
al., 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from layerscope.health._alert import Alert
from layerscope.health._episodes import Episodes
from layerscope.health._order import ModuleOrder
from layerscope.model import AttentionRow

_ADVICE = (
    "attention logits grown this large come before loss spikes: a too high learning rate "
    "grows them; normalising queries and keys (QK-norm) bounds them"
)

Head = tuple[str, int, int]  # (module, call, head)

# A head below a fifth of both bounds alerts at its first such recorded step: no odd batch
# takes a healthy head there, and recorded steps may be far apart (one in 100 by default).
_DEEP = 5


class AttentionCollapse:
    """A head's mean attention entropy far below its start, and near one-hot in absolute terms.

    The start is a head's mean ``entropy_mean`` over its first ``baseline`` recorded training
    steps. A head collapses where its entropy is below ``fraction`` times its start and its
    ``entropy_frac`` (entropy over the most its keys allow) below ``frac_below``, for ``steps``
    recorded steps in a row, or at once where it is below a fifth of both; back to twice
    either bound, for as many steps, ends the episode.
    A head is keyed by its module, call and head; rows of one step and head (one per rank,
    where ranks' rows are merged) are averaged. Evaluation rows are left out.

    Options: ``fraction`` (0.1), ``frac_below`` (0.05), ``steps`` (2), ``baseline`` (3).

    Heads specialise as a transformer trains, so their entropy falls steadily, not to zero:
    in a 2-layer, 4-head character GPT (context 64, AdamW, 2,000 steps) at learning rates 1e-3
    and 3e-3, every head kept more than 0.3 of its start and an ``entropy_frac`` above 0.3. At
    3e-2 and 1e-1 the first layer's heads fell below 0.01 nats within 100 steps, and the loss
    stalled near 3 (1.6 at 3e-3 by step 500). A head diffuse at start (``ln 64`` = 4.2 nats)
    and one-hot at 0.05 nats is at 0.012 of both. ``frac_below`` 0.05 is 0.2 nats over 64
    keys (a query with that entropy puts about 0.95 or more on one key), 0.35 over 1,024.
    Both bounds must hold, so a head sharp from the start alerts only when it is also near
    one-hot, and a head sharpening as it learns alerts only once it is. Two steps in a row
    keep one odd batch quiet.
    """

    name = "attention_collapse"
    defaults: ClassVar[dict[str, Any]] = {
        "fraction": 0.1,
        "frac_below": 0.05,
        "steps": 2,
        "baseline": 3,
    }

    def __init__(
        self, order: ModuleOrder, fraction: float, frac_below: float, steps: float, baseline: float
    ) -> None:
        self._order = order
        self._fraction = fraction
        self._frac_below = frac_below
        self._steps = max(int(steps), 1)
        self._baseline = max(int(baseline), 1)
        self._episodes = Episodes(patience=self._steps, recovery=self._steps)
        self._first: dict[Head, list[float]] = {}  # the entropies of its baseline's steps
        self._first_step: dict[Head, int] = {}
        self._start: dict[Head, float] = {}  # the baseline's mean, once complete
        self._last_step: dict[Head, int] = {}  # a step's rows are judged once
        self._since: dict[Head, int] = {}  # the first step of a run of collapsed steps

    def observe(self, rows: Sequence[AttentionRow]) -> list[Alert]:
        """Alerts of a flush's attention rows: each step's heads, in the order they came."""
        steps: dict[tuple[int, Head], list[AttentionRow]] = {}
        for row in rows:
            if row.phase == "train":
                steps.setdefault((row.step, (row.module, row.call, row.head)), []).append(row)
        alerts: list[Alert] = []
        # Python's sort is stable: within a step, heads keep the order they came in.
        for (step, head), same in sorted(steps.items(), key=lambda item: item[0][0]):
            if step <= self._last_step.get(head, -1):
                continue
            self._last_step[head] = step
            entropy = math.fsum(row.entropy_mean for row in same) / len(same)
            frac = math.fsum(row.entropy_frac for row in same) / len(same)
            if not math.isfinite(entropy):  # NaN attention is the nonfinite rule's
                continue
            if head not in self._start:
                self._found(step, head, entropy)
                continue
            alerts += self._judge(step, head, entropy, frac, max(row.keys for row in same))
        return alerts

    def _found(self, step: int, head: Head, entropy: float) -> None:
        """Keep an entropy of a baseline step; a full baseline's mean is the head's start."""
        first = self._first.setdefault(head, [])
        self._first_step.setdefault(head, step)
        first.append(entropy)
        if len(first) == self._baseline:
            self._start[head] = math.fsum(first) / len(first)
            del self._first[head]

    def _judge(self, step: int, head: Head, entropy: float, frac: float, keys: int) -> list[Alert]:
        start = self._start[head]
        if not start > 0:  # one key, or one-hot from the start: nothing to collapse from
            return []
        share = entropy / start
        # A NaN fraction (queries with one key only) compares False: it never holds.
        holds = share < self._fraction and frac < self._frac_below
        deep = share < self._fraction / _DEEP and frac < self._frac_below / _DEEP
        clear = share >= 2 * self._fraction or frac >= 2 * self._frac_below
        state = True if holds else (False if clear else None)
        if state:
            self._since.setdefault(head, step)
        elif state is False:
            self._since.pop(head, None)
        if not self._episodes.observe(head, state, at_once=deep):
            return []
        since = self._since.pop(head, step)
        return [self._alert(step, head, entropy, share, frac, keys, since)]

    def _alert(
        self,
        step: int,
        head: Head,
        entropy: float,
        share: float,
        frac: float,
        keys: int,
        since: int,
    ) -> Alert:
        module, call, number = head
        start, start_step = self._start[head], self._first_step[head]
        kind = self._order.type_of(module)
        of_call = f"call {call} of " if call else ""
        name = f"head {number} of {of_call}{module or 'the model'}{f' ({kind})' if kind else ''}"
        return Alert(
            step=step,
            phase="train",
            rule=self.name,
            module=module,
            kind="attention",
            tensor=f"head {number}" + (f" (call {call})" if call else ""),
            severity="warning",
            value=share,
            threshold=self._fraction,
            message=(
                f"{name} has collapsed onto single keys since step {since}: its attention "
                f"entropy is {entropy:.3g} nats at step {step}, {share:.1%} of its "
                f"{start:.3g} nats from step {start_step} on, and {frac:.1%} of the most its "
                f"{keys} keys allow; {_ADVICE}"
            ),
        )
