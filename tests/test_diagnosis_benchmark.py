"""benchmarks/diagnosis.py: its scorer on hand-made alerts, and one real case end to end."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the script and its zoo, as the script finds them
try:
    import diagnosis
    from diagnosis_zoo import CASES, Case, Said, alarms, judge, window
finally:
    sys.path.remove(str(BENCHMARKS))

# The default schedule's recorded steps in a run of 120 (every step of the first 10, then
# one in 100), and every=10's.
DEFAULT = [*range(10), 100]
EVERY_10 = list(range(0, 120, 10))


def _case(**changes: object) -> Case:
    fields: dict[str, object] = {
        "name": "planted",
        "model": "MLP",
        "bug": "a bug",
        "family": "exploding_grad",
        "layers": ("fc2",),
        "planted": 40,
        "visible": 40,
        "build": lambda buggy: None,
    }
    return Case(**{**fields, **changes})  # type: ignore[arg-type]


def _said(step: int, rule: str = "exploding_grad", module: str = "fc2", severity: str = "warning"):
    return Said(step, rule, module, severity)


def test_the_window_is_the_first_two_steps_that_show_the_bug():
    case = _case()
    assert window(case, EVERY_10) == (40, 50)
    assert window(case, DEFAULT) == (100, 100)  # one recorded step after 40: no grace after it
    # The loss, logged every step, shows it before the default schedule's statistics.
    assert window(_case(scalar_visible=41), DEFAULT) == (41, 42)
    assert window(_case(visible=None, scalar_visible=45), EVERY_10) == (45, 46)
    assert window(_case(visible=110), [*range(10)]) is None  # nothing recorded after it


@pytest.mark.parametrize(
    ("said", "verdict"),
    [
        ([_said(40)], "right"),
        ([_said(50)], "right"),  # one recorded step later: the grace
        ([_said(45)], "right"),  # between two recorded steps: a sentinel's, say
        ([_said(60)], "late"),
        ([_said(40, module="fc1")], "wrong layer"),
        ([_said(40, rule="dead")], "wrong rule"),
        ([], "missed"),
        ([_said(40, severity="info")], "missed"),  # a note is not a diagnosis
        ([_said(12)], "missed"),  # before the bug was planted: about something else
    ],
)
def test_verdicts_of_hand_made_alerts(said, verdict):
    judged = judge(_case(), said, EVERY_10)
    assert judged.verdict == verdict
    assert judged.window == (40, 50)
    assert judged.said == (None if verdict == "missed" else said[0])


def test_the_first_alert_of_the_family_is_judged_not_the_best():
    # The earliest alert of the expected family names the wrong layer; a right one after it
    # does not mend that. An alert of another rule before them does not count against it.
    said = [_said(40, rule="dead", module="act1"), _said(40, module="fc1"), _said(50)]
    judged = judge(_case(), said, EVERY_10)
    assert (judged.verdict, judged.said) == ("wrong layer", said[1])
    # Another rule's alert is what was said only where the family said nothing.
    assert judge(_case(), said[:1], EVERY_10).said == said[0]


def test_accepted_families_and_cases_of_no_layer():
    nan = _said(30, rule="nonfinite", module="act1", severity="error")
    skips = {"family": "scaler_skips", "layers": ("norm", "act1"), "planted": 30, "visible": 30}
    assert judge(_case(**skips), [nan], EVERY_10).verdict == "wrong rule"
    assert judge(_case(**skips, also=("nonfinite",)), [nan], EVERY_10).verdict == "right"
    data = _case(family="loss_collapse", layers=(), visible=None, scalar_visible=45)
    assert judge(data, [_said(46, "loss_collapse", "head")], DEFAULT).verdict == "right"
    assert judge(data, [_said(47, "loss_collapse", "")], DEFAULT).verdict == "late"


def test_a_layer_no_recorded_step_shows_must_go_unnamed():
    # The NaN of step 37 poisons every weight: only a record of step 37 shows its layer.
    nan = {"family": "nonfinite", "layers": ("log_probs",), "planted": 37, "visible": 37,
           "scalar_visible": 38, "origin_until": 37}  # fmt: skip
    unnamed, innocent = _said(38, "nonfinite", ""), _said(40, "nonfinite", "fc1")
    assert judge(_case(**nan), [unnamed], EVERY_10).verdict == "right"
    assert judge(_case(**nan), [innocent], EVERY_10).verdict == "wrong layer"
    every_step = list(range(120))  # step 37 recorded: the layer is there to name
    assert judge(_case(**nan), [unnamed], every_step).verdict == "wrong layer"
    assert judge(_case(**nan), [_said(37, "nonfinite", "log_probs")], every_step).verdict == (
        "right"
    )


def test_said_from_the_scalars_first_the_layer_comes_with_the_first_recorded_steps():
    skips = _case(family="scaler_skips", layers=("norm",), planted=30, visible=30,
                  scalar_visible=32)  # fmt: skip
    unnamed = _said(32, "scaler_skips", "")
    named = [unnamed, _said(100, "scaler_skips", "norm")]
    assert judge(skips, named, DEFAULT).verdict == "right"
    assert judge(skips, [unnamed], DEFAULT).verdict == "wrong layer"  # never named
    assert judge(skips, [unnamed, _said(100, "scaler_skips", "fc1")], DEFAULT).verdict == (
        "wrong layer"
    )
    # Under every=10 step 30 shows the layer before the scalars do: unnamed is wrong there.
    assert judge(skips, [_said(40, "scaler_skips", ""), _said(40, "scaler_skips", "norm")],
                 EVERY_10).verdict == "wrong layer"  # fmt: skip


def test_false_alarms_are_warnings_and_errors():
    said = [_said(3, severity="info"), _said(5), _said(7, "nonfinite", severity="error")]
    assert alarms(said) == said[1:]


def test_a_case_states_where_and_when_it_shows():
    with pytest.raises(ValueError, match="family"):
        _case(family="exploding")
    with pytest.raises(ValueError, match="visible or scalar_visible"):
        _case(visible=None)
    with pytest.raises(ValueError, match="planted <= visible"):
        _case(visible=39)
    # The zoo itself: enough cases, models and the classes it promises, each well formed.
    assert len(CASES) >= 24
    assert len({case.model for case in CASES}) >= 5
    assert len({case.name for case in CASES}) == len(CASES)


def test_cases_are_chosen_by_name_and_size():
    assert [case.name for case in diagnosis.chosen("gpt-head", small=False)] == [
        "gpt-head-collapse"
    ]
    small = diagnosis.chosen(None, small=True)
    assert 2 <= len(small) <= 3
    assert all(case.small for case in small)
    with pytest.raises(SystemExit, match="no case name holds 'nothing-like-it'"):
        diagnosis.chosen("nothing-like-it", small=False)


@pytest.fixture
def one_thread():
    # As the script runs: a second thread only waits on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_a_real_case_and_its_twin_under_both_schedules(monkeypatch, tmp_path):
    (case,) = diagnosis.chosen("mlp-labels-one-class", small=True)
    outcomes = diagnosis.run_case(case)
    assert list(outcomes) == ["default", "every=10"]
    (bug, twin, default), (sampled_bug, _, sampled) = outcomes["default"], outcomes["every=10"]
    assert bug.recorded == tuple(DEFAULT)
    assert sampled_bug.recorded == tuple(EVERY_10)
    # Same seed, same batches: the runs agree until the bug is planted, then part.
    assert bug.losses[:40] == twin.losses[:40]
    assert bug.losses[60] < 1e-3 < 0.1 < twin.losses[60] < math.log(10)
    assert default.window == sampled.window == (45, 46)
    text = diagnosis.table({case.name: outcomes})
    row = next(line for line in text.splitlines() if line.startswith(f"| {case.name} |"))
    for verdict in (default, sampled):
        said = "nothing" if verdict.said is None else str(verdict.said)
        assert f"| {said} | {verdict.verdict} |" in row
    assert "out of 1**" in text
    assert "of 1 twins**" in text
    # --write replaces its own section of BENCHMARKS.md and keeps the others.
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(f"# Benchmarks\n\n## {diagnosis.TITLE}\n\nold\n\n## Other\n\nkept\n")
    monkeypatch.setattr(diagnosis.report, "PATH", path)
    diagnosis.write(text, 1.0, 1)
    written = path.read_text()
    assert "old" not in written
    assert row in written
    assert written.endswith("## Other\n\nkept\n")
