"""Every number ``watch()``, ``Schedule``, ``capture()``, the health rules and a store take is
bounded: a value just past its bound is refused with a ValueError that names the argument, and
the bound itself is accepted.
"""

import math
import subprocess
import sys

import pytest
import torch
from torch import nn

import layerscope
from layerscope._limits import (
    MAX_COUNT,
    MAX_FLUSH_SECONDS,
    MAX_LINEAR_BINS,
    MAX_PERIOD_SECONDS,
    MAX_QUEUE_SIZE,
    MAX_RULE_BASELINE,
    MAX_STEP,
    MAX_WORKERS,
    RULE_OPTION_BOUNDS,
    WHOLE_RULE_OPTIONS,
    Bound,
    check_within,
)
from layerscope.health import RULES, parse_alerts
from layerscope.tensors import check_on_tensor, parse_tensors


def keep_nothing(record, directory):
    """An ``on_tensor`` that pickles by reference."""


def _model():
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU())


def _watch(**arguments):
    layerscope.watch(_model(), **arguments).close()


def _capture(**arguments):
    layerscope.capture(_model(), **arguments).close()


def _store(**arguments):
    pytest.importorskip("pyarrow")
    from layerscope.store import ParquetStore

    ParquetStore("memory://bounds/never-started", **arguments)


# (name in the message, call with a value, the bound, the first value past it)
CASES = [
    ("every", lambda v: _watch(every=v), MAX_STEP, MAX_STEP + 1),
    ("histogram: bins", lambda v: _watch(histogram=("linear", 0, 1, v)),
     MAX_LINEAR_BINS, MAX_LINEAR_BINS + 1),
    ("start_step", lambda v: _watch(start_step=v), MAX_STEP, MAX_STEP + 1),
    ("noise_scale", lambda v: _watch(noise_scale=v), MAX_COUNT, MAX_COUNT + 1),
    ("Schedule: every", lambda v: layerscope.Schedule(every=v), MAX_STEP, MAX_STEP + 1),
    ("Schedule: start", lambda v: layerscope.Schedule(start=v), MAX_STEP, MAX_STEP + 1),
    ("Schedule: dense", lambda v: layerscope.Schedule(dense=v), MAX_STEP, MAX_STEP + 1),
    ("Schedule: stop", lambda v: layerscope.Schedule(stop=v), MAX_STEP, MAX_STEP + 1),
    ("tensors: every", lambda v: parse_tensors({"include": "0", "every": v}),
     MAX_STEP, MAX_STEP + 1),
    ("tensors: every_seconds", lambda v: parse_tensors({"include": "0", "every_seconds": v}),
     MAX_PERIOD_SECONDS, math.inf),
    ("tensors: max_bytes", lambda v: parse_tensors({"include": "0", "max_bytes": v}),
     MAX_COUNT, MAX_COUNT + 1),
    ("workers", lambda v: check_on_tensor(keep_nothing, v), MAX_WORKERS, MAX_WORKERS + 1),
    ("every", lambda v: _capture(every=v), MAX_STEP, MAX_STEP + 1),
    ("max_bytes", lambda v: _capture(max_bytes=v), MAX_COUNT, MAX_COUNT + 1),
    ("flush_steps", lambda v: _store(flush_steps=v), MAX_STEP, MAX_STEP + 1),
    ("flush_seconds", lambda v: _store(flush_seconds=v),
     MAX_FLUSH_SECONDS, math.nextafter(MAX_FLUSH_SECONDS, math.inf)),
    ("queue_size", lambda v: _store(queue_size=v), MAX_QUEUE_SIZE, MAX_QUEUE_SIZE + 1),
]  # fmt: skip


@pytest.mark.parametrize(("name", "call", "bound", "past"), CASES, ids=[c[0] for c in CASES])
def test_an_argument_just_past_its_bound_is_refused_by_name_and_the_bound_accepted(
    name, call, bound, past
):
    call(bound)
    with pytest.raises(ValueError, match=rf"^{name}: expected .*, got {past!r}$"):
        call(past)


def _past(bound: Bound, option: str):
    """The values just outside ``bound``: below its low end, and above its high end."""
    step = 1 if option in WHOLE_RULE_OPTIONS else None
    below = bound.low - 1 if step else math.nextafter(bound.low, -math.inf)
    if bound.high == math.inf:
        return [below, math.inf, math.nan]
    above = bound.high + 1 if step else math.nextafter(bound.high, math.inf)
    return [below, above]


RULE_OPTIONS = [
    (rule, option, bound)
    for rule, options in RULE_OPTION_BOUNDS.items()
    for option, bound in options.items()
]


@pytest.mark.parametrize(("rule", "option", "bound"), RULE_OPTIONS,
                         ids=[f"{rule}.{option}" for rule, option, _ in RULE_OPTIONS])  # fmt: skip
def test_each_health_rule_option_is_bounded(rule, option, bound):
    ends = [bound.low] + ([] if bound.high == math.inf else [bound.high])
    for end in ends:
        value = int(end) if option in WHOLE_RULE_OPTIONS else float(end)
        assert parse_alerts({rule: {option: value}}).rules[rule][option] == value
    for value in _past(bound, option):
        with pytest.raises(ValueError, match=rf"^alerts\['{rule}'\]\['{option}'\]: expected"):
            parse_alerts({rule: {option: value}})


def test_every_numeric_rule_option_has_a_bound_and_only_those():
    numeric = {
        (rule, option)
        for rule, kind in RULES.items()
        for option, default in kind.defaults.items()
        if isinstance(default, int | float)
    }
    assert numeric == {(rule, option) for rule, option, _ in RULE_OPTIONS}


def test_rule_options_refuse_a_fraction_of_a_step_and_a_bool():
    with pytest.raises(ValueError, match=r"alerts\['dead'\]\['steps'\]: expected a whole"):
        parse_alerts({"dead": {"steps": 2.5}})
    assert parse_alerts({"dead": {"steps": 4.0}}).rules["dead"]["steps"] == 4.0
    with pytest.raises(TypeError, match=r"alerts\['dead'\]\['threshold'\]: expected float"):
        parse_alerts({"dead": {"threshold": True}})


def test_a_negative_loss_spike_window_is_refused_at_watch():
    with pytest.raises(ValueError, match=r"alerts\['loss_spike'\]\['window'\]: .* from 1 to 2"):
        layerscope.watch(_model(), alerts={"loss_spike": {"window": -1}})
    with pytest.raises(ValueError, match=r"\['activation_drift'\]\['baseline'\]: .* to 1000,"):
        layerscope.watch(_model(), alerts={"activation_drift": {"baseline": MAX_RULE_BASELINE + 1}})


def test_numbers_too_large_for_a_float_are_refused_not_overflowed():
    with pytest.raises(ValueError, match=r"^histogram: lo and hi must be finite"):
        layerscope.watch(_model(), histogram=("linear", -(10**400), 1, 4))
    with pytest.raises(ValueError, match=r"^histogram: bins: expected a value from 1 to 4096"):
        layerscope.watch(_model(), histogram=("linear", 0, 1, 10**400))
    with pytest.raises(ValueError, match=r"^start_step: expected a value from 0 to 2\*\*53"):
        layerscope.watch(_model(), start_step=2**63 - 2)
    with pytest.raises(ValueError, match=r"^x: expected a finite value >= 0, got nan"):
        check_within(math.nan, "x", Bound(0, math.inf))


def test_a_run_started_at_the_largest_step_is_listed_and_read(tmp_path):
    pytest.importorskip("duckdb")
    model = _model()
    with layerscope.watch(model, every=1, start_step=MAX_STEP, run=tmp_path / "late") as scope:
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            scope.step(loss=1.0)
    (row,) = layerscope.runs(tmp_path).to_dict("records")
    assert row["status"] == "finished"
    run = layerscope.load(tmp_path / "late")
    assert run.meta["config"]["start_step"] == MAX_STEP
    assert sorted(set(run.stats.step)) == [MAX_STEP, MAX_STEP + 1]


def test_the_bounds_are_read_without_torch():
    # A reader of run.json holds stored values to the same bounds, and imports no torch.
    code = "import sys, layerscope._limits; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
