"""``attention_collapse``: a head's entropy fallen near zero alerts once an episode; a head
that sharpens as it learns stays quiet."""

from __future__ import annotations

import math
import random

import pytest
from flushes import Flushes, model
from torch import nn

import layerscope
from layerscope.health import Alert, HealthMonitor, parse_alerts
from layerscope.model import AttentionRow, ModuleInfo

KEYS = 64
UNIFORM = math.log(KEYS)  # nats: attention spread evenly over 64 keys
MODULES = ("blocks.0.attn", "blocks.1.attn")
INFOS = [ModuleInfo("", "GPT", {}, 0, 0, (), True)] + [
    ModuleInfo(name, "MultiheadAttention", {}, 0, 0, (), True) for name in MODULES
]


def _row(
    step: int,
    module: str,
    head: int,
    entropy: float,
    *,
    call: int = 0,
    phase: str = "train",
    rank: int = 0,
) -> AttentionRow:
    frac = entropy / UNIFORM  # as if every query attended over all the keys
    return AttentionRow(step, phase, rank, module, call, head, KEYS, entropy, entropy, frac, 0.5)


def _monitor(**options: object) -> HealthMonitor:
    return HealthMonitor(parse_alerts({"attention_collapse": options}), INFOS)


def _run(monitor: HealthMonitor, rows: list[AttentionRow], per_flush: int = 4) -> list[Alert]:
    """Feed ``rows`` a few steps a flush, as the writer does; every alert found."""
    steps = sorted({row.step for row in rows})
    alerts: list[Alert] = []
    for first in range(0, len(steps), per_flush):
        chosen = set(steps[first : first + per_flush])
        alerts += monitor.observe([], [], attention=[r for r in rows if r.step in chosen])
    return alerts


def _heads(steps: range, entropy_of: dict[tuple[str, int], list[float]]) -> list[AttentionRow]:
    """Rows of each (module, head) at each step, its entropies given in step order."""
    return [
        _row(step, module, head, entropies[at])
        for at, step in enumerate(steps)
        for (module, head), entropies in entropy_of.items()
    ]


def _collapse(
    steps: int, collapsed: set[int], module: str = "blocks.1.attn", head: int = 2
) -> list[AttentionRow]:
    """Two modules of four heads at 0.7 ln 64, but ``(module, head)`` at 0.05 nats at
    ``collapsed`` steps."""
    entropy_of = {
        (name, number): [0.7 * UNIFORM] * steps for name in MODULES for number in range(4)
    }
    entropy_of[(module, head)] = [0.05 if s in collapsed else 0.7 * UNIFORM for s in range(steps)]
    return _heads(range(steps), entropy_of)


def test_heads_that_sharpen_as_they_learn_stay_quiet():
    # As in a small GPT: each head's entropy falls steadily to a third of its start or less,
    # one sharp head down to 0.08 of the uniform attention's, with batch-to-batch noise.
    rng = random.Random(0)
    ends = [0.5, 0.4, 0.3, 0.2, 0.6, 0.35, 0.25, 0.08]
    entropy_of = {
        (module, head): [
            UNIFORM * (0.8 + (ends[4 * m + head] - 0.8) * min(s / 150, 1)) * rng.uniform(0.9, 1.1)
            for s in range(300)
        ]
        for m, module in enumerate(MODULES)
        for head in range(4)
    }
    rows = _heads(range(0, 3000, 10), entropy_of)
    assert min(row.entropy_frac for row in rows) < 0.1  # sharp
    assert _run(_monitor(), rows, per_flush=10) == []


def test_a_collapsed_head_alerts_once_naming_its_module_head_and_first_step():
    # Collapsed from step 11 on: the second step in a row, step 12, is in the next flush.
    rows = _collapse(30, set(range(11, 30)))
    [alert] = _run(_monitor(), rows)
    start = math.fsum([0.7 * UNIFORM] * 3) / 3  # its first three recorded steps
    assert (alert.step, alert.phase, alert.rule, alert.severity) == (
        12, "train", "attention_collapse", "warning",
    )  # fmt: skip
    assert (alert.module, alert.kind, alert.tensor) == ("blocks.1.attn", "attention", "head 2")
    assert alert.value == pytest.approx(0.05 / start, rel=1e-12)
    assert alert.threshold == 0.1
    assert alert.message.startswith(
        "head 2 of blocks.1.attn (MultiheadAttention) has collapsed onto single keys since "
        "step 11: its attention entropy is 0.05 nats at step 12, "
        f"{0.05 / start:.1%} of its {start:.3g} nats from step 0 on, and "
        f"{0.05 / UNIFORM:.1%} of the most its 64 keys allow; "
    )


def test_a_head_far_below_both_bounds_alerts_at_its_first_recorded_step():
    # The default schedule: steps 0 to 9, then 100. At 100 one head is at 0.05 nats, 0.012
    # of the most its keys allow: one step, so quiet until the next, 200.
    steps = [*range(10), 100]
    rows = [r for r in _collapse(101, {100}, head=1) if r.step in steps]
    assert _run(_monitor(), rows) == []
    # At 0.01 nats it is below a fifth of both bounds: no odd batch goes there, and the next
    # recorded step is too late to wait for.
    deep = [
        r._replace(entropy_mean=0.01, entropy_frac=0.01 / UNIFORM) if r.entropy_mean == 0.05 else r
        for r in rows
    ]
    [alert] = _run(_monitor(), deep)
    assert (alert.step, alert.module, alert.tensor) == (100, "blocks.1.attn", "head 1")
    assert "since step 100:" in alert.message


def test_steps_and_fraction_are_options():
    rows = _collapse(30, set(range(11, 30)))
    [alert] = _run(_monitor(steps=1), rows)
    assert alert.step == 11
    # 0.25 nats: below 0.1 of its start (2.91) but 0.06 of the most 64 keys allow, not near
    # one-hot: quiet unless frac_below allows it; a fraction of 0.05 keeps it quiet again.
    rows = [r._replace(entropy_mean=0.25, entropy_frac=0.25 / UNIFORM) if r.entropy_mean == 0.05
            else r for r in rows]  # fmt: skip
    assert _run(_monitor(), rows) == []
    [alert] = _run(_monitor(frac_below=0.1), rows)
    assert alert.step == 12
    assert _run(_monitor(frac_below=0.1, fraction=0.05), rows) == []


def test_a_recovered_head_that_collapses_again_alerts_again():
    # Collapsed 10 to 19 (back up for one step, 15, which does not end the episode), up again
    # from 20, collapsed again from 30.
    collapsed = (set(range(10, 20)) - {15}) | set(range(30, 40))
    alerts = _run(_monitor(), _collapse(40, collapsed))
    assert [alert.step for alert in alerts] == [11, 31]
    assert "since step 30:" in alerts[1].message


def test_one_step_up_in_the_middle_band_neither_clears_nor_restarts():
    # Two steps at 0.12 of the start (above 0.1, below 0.2), 0.084 of the most its keys allow
    # (above 0.05, below 0.1): the episode from step 11 stays open, where two steps clear
    # would end it and the collapse after would alert again.
    rows = _collapse(30, set(range(11, 30)))
    middle = {"entropy_mean": 0.12 * 0.7 * UNIFORM, "entropy_frac": 0.12 * 0.7}
    rows = [r._replace(**middle) if r.step in (14, 15) and r.entropy_mean == 0.05 else r
            for r in rows]  # fmt: skip
    assert [alert.step for alert in _run(_monitor(), rows)] == [12]


def test_evaluation_rows_are_left_out():
    rows = _collapse(30, set(range(11, 30)))
    # Evaluation passes at every step, collapsed from the start: no baseline, no alert.
    evaluation = [r._replace(phase="eval", entropy_mean=0.05, entropy_frac=0.05 / UNIFORM)
                  for r in rows]  # fmt: skip
    [alert] = _run(_monitor(), [row for pair in zip(evaluation, rows, strict=True) for row in pair])
    assert alert.step == 12
    assert f"of its {0.7 * UNIFORM:.3g} nats from step 0 on" in alert.message
    assert _run(_monitor(), evaluation) == []


def test_calls_and_heads_are_judged_apart():
    # A module called twice a step: call 1's head 3 collapses from step 5, call 0's head 0
    # from step 20; the other heads and calls stay diffuse.
    rows = [
        _row(step, "blocks.0.attn", head, entropy, call=call)
        for step in range(30)
        for call in (0, 1)
        for head in range(4)
        for entropy in [
            0.05
            if (call, head, step >= 5) == (1, 3, True) or (call, head, step >= 20) == (0, 0, True)
            else 0.7 * UNIFORM
        ]
    ]
    alerts = _run(_monitor(), rows, per_flush=7)
    assert [(a.step, a.module, a.tensor) for a in alerts] == [
        (6, "blocks.0.attn", "head 3 (call 1)"),
        (21, "blocks.0.attn", "head 0"),
    ]
    assert alerts[0].message.startswith(
        "head 3 of call 1 of blocks.0.attn (MultiheadAttention) has collapsed"
    )


def test_ranks_rows_of_a_head_make_one_judgement():
    rows = _collapse(30, set(range(11, 30)))
    both = [r for row in rows for r in (row, row._replace(rank=1))]
    assert [alert.step for alert in _run(_monitor(), both)] == [12]


def test_heads_with_nothing_to_collapse_from_or_nan_stay_quiet():
    # One key: entropy zero from the start, and no fraction (queries with one key have none).
    one_key = [
        AttentionRow(s, "train", 0, "blocks.0.attn", 0, 0, 1, 0.0, 0.0, math.nan, 1.0)
        for s in range(20)
    ]
    nan = [r._replace(entropy_mean=math.nan) if r.step > 10 else r for r in _collapse(20, set())]
    assert _run(_monitor(), one_key + nan) == []


def test_alerts_sort_by_step_among_the_other_rules():
    # Random flushes of statistics whose rules fire, with a collapse planted: the other
    # rules' alerts are as without it, and the flush's alerts come step by step.
    rng = random.Random(3)
    infos = model(rng)
    options = {
        "loss_spike": False,
        "scaler_skips": False,  # the scalars' rules come after the rows'
        "dead": {"steps": 1},
        "activation_drift": {"factor": 10.0},
    }
    plain = HealthMonitor(parse_alerts(options), infos)
    monitor = HealthMonitor(parse_alerts(options), infos)
    seen: set[int] = set()
    inside = 0  # flushes where the collapse's alert comes between others
    for _, (chunks, scalars) in zip(range(20), Flushes(3, infos), strict=False):
        steps = sorted({int(s) for chunk in chunks if not chunk.sentinel for s in chunk.step})
        rows = [_row(step, infos[1].name, 0, 0.05 if len(seen) >= 6 else UNIFORM) for step in steps]
        seen.update(steps)
        alerts = monitor.observe(chunks, scalars, attention=rows)
        others = [alert for alert in alerts if alert.rule != "attention_collapse"]
        assert others == plain.observe(chunks, scalars)
        assert [a.step for a in alerts] == sorted(a.step for a in alerts)
        rules = [alert.rule for alert in alerts]
        inside += "attention_collapse" in rules[1:-1]
    assert inside == 1


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"fractoin": 0.1},
            ValueError,
            r"alerts\['attention_collapse'\]: unknown option 'fractoin'",
        ),
        ({"steps": "two"}, TypeError, r"alerts\['attention_collapse'\]\['steps'\]: expected int"),
        (3, TypeError, r"alerts\['attention_collapse'\]: expected True, False or a dict"),
    ],
)
def test_bad_options_name_the_argument(options, error, match):
    with pytest.raises(error, match=match):
        layerscope.watch(nn.Linear(2, 2), alerts={"attention_collapse": options})


def test_false_turns_the_rule_off_and_leaves_the_others():
    config = parse_alerts({"attention_collapse": False})
    assert "attention_collapse" not in config.rules
    assert "dead" in config.rules
    assert parse_alerts(True).rules["attention_collapse"] == {
        "fraction": 0.1, "frac_below": 0.05, "steps": 2, "baseline": 3,
    }  # fmt: skip
    monitor = HealthMonitor(config, INFOS)
    assert _run(monitor, _collapse(30, set(range(11, 30)))) == []
