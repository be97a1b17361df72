"""A row of the ``attention`` table: one head of one attention call on a recorded step.

Each attention call made inside the watched model on a recorded step (a call of
``torch.nn.functional.scaled_dot_product_attention``, or an ``nn.MultiheadAttention``'s
forward) gives one row per head. ``module`` is the innermost module whose forward made the
call, ``call`` counts that module's attention calls within the pass (micro-batches of a step
merge by it), ``keys`` is the number of keys the call attends over. Entropies are in nats,
over the keys each query may attend to; ``entropy_frac`` divides each query's entropy by the
log of its own number of allowed keys (queries with one key leave it out), so a causal
call's first queries do not read as collapsed.
"""

from __future__ import annotations

from typing import NamedTuple

#: The table's columns, in order.
ATTENTION_COLUMNS = (
    "step", "phase", "rank", "module", "call", "head", "keys",
    "entropy_mean", "entropy_min", "entropy_frac", "max_prob",
)  # fmt: skip


class AttentionRow(NamedTuple):
    """One head of one attention call on a recorded step."""

    step: int
    phase: str  # "train" or "eval"
    rank: int
    module: str  # the innermost module whose forward made the call
    call: int  # that module's attention calls in the pass, from 0
    head: int
    keys: int  # keys the call attends over
    entropy_mean: float  # nats, mean over the batch's queries
    entropy_min: float  # nats, the lowest query's
    entropy_frac: float  # mean over queries of entropy / log(allowed keys), in [0, 1]
    max_prob: float  # mean over queries of the largest probability
