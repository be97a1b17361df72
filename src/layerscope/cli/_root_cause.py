"""The alert a run's trouble most likely began with, and how many came after it.

When training goes wrong one event sets off many rules: a learning rate far too high makes
updates too large, then gradients explode, then the loss spikes and values turn NaN. The
alerts of the earliest step that has any are the candidates; of those, the rule that names a
cause is chosen over one that names its symptoms (a module in eval mode before the drift of
its outputs, an update too large before the gradients that grow from it, anything before the
loss).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from layerscope.cli import _format
from layerscope.cli._layers import shown_name

if TYPE_CHECKING:
    from layerscope.store import Run

# Causes first, symptoms last; a rule not named here comes after the named causes and
# before the loss's rules.
_CAUSES_FIRST = (
    "eval_mode", "wrong_loss", "accumulating_grad", "constant_input", "update_ratio",
    "exploding_grad", "nonfinite", "scaler_skips", "vanishing_grad", "dead",
    "activation_drift", "attention_collapse",
)  # fmt: skip
_LOSS_RULES = ("loss_spike", "loss_collapse", "not_learning")


def rank_of(rule: str) -> int:
    """Where ``rule`` stands among the candidates: lower is likelier the cause.

    Examples:
        >>> rank_of("eval_mode") < rank_of("activation_drift") < rank_of("loss_spike")
        True
        >>> rank_of("a_rule_of_someone_else") < rank_of("loss_spike")
        True
    """
    if rule in _CAUSES_FIRST:
        return _CAUSES_FIRST.index(rule)
    if rule in _LOSS_RULES:
        return len(_CAUSES_FIRST) + 1 + _LOSS_RULES.index(rule)
    return len(_CAUSES_FIRST)


def root_cause_fields(run: Run) -> list[tuple[str, str]] | None:
    """The likely root cause among the run's warnings and errors; None where there are none.

    Fields: its step, rule, layer and message, then what came after it, counted by rule.
    """
    frame = run.sql(
        "select step, rule, module, message from alerts"
        " where severity in ('warning', 'error') order by step"
    )
    if frame.empty:
        return None
    steps = [int(step) for step in frame.step]
    first_step = steps[0]
    rows = list(frame.itertuples(index=False))
    at_first = [(rank_of(_format.text(row.rule)), index) for index, row in enumerate(rows)]
    _, chosen = min(item for item in at_first if steps[item[1]] == first_step)
    cause = rows[chosen]
    fields = [
        ("step", _format.number(cause.step)),
        ("rule", _format.text(cause.rule)),
        ("layer", shown_name(_format.text(cause.module))),
        ("says", _format.text(cause.message)),
    ]
    after = Counter(_format.text(row.rule) for index, row in enumerate(rows) if index != chosen)
    if after:
        counted = ", ".join(f"{rule} {n}" for rule, n in after.most_common())
        fields.append(("then", f"{sum(after.values())} more: {counted}"))
    return fields
