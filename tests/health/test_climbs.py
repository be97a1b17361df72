"""Growth that compounds over recorded steps, on hand-made rows: an output gradient grown past
its own usual scale at recorded steps in a row (``exploding_grad``'s ``climb``), and an output
that climbs step after step or is far past its start at its only recorded step
(``activation_drift``)."""

from __future__ import annotations

from test_gradient_growth import CHAIN, _exits, _flush, _infos

from layerscope.health import Alert, HealthMonitor, parse_alerts
from layerscope.model import Identities, Kind

Rows = list[tuple[str, Kind, str, float]]


def _alerts(steps: dict[int, Rows], rule: str) -> list[Alert]:
    monitor = HealthMonitor(parse_alerts(True), _infos(CHAIN))
    monitor.learn_calls(_exits(CHAIN))
    identities = Identities()
    alerts = []
    for step, rows in steps.items():
        alerts += monitor.observe(_flush(identities, step, rows), [])
    return [a for a in alerts if a.rule == rule]


def _gradients(grown: float) -> Rows:
    """The chain's output gradients, fc2's and those before it (which it feeds) ``grown``."""
    usual = {"fc1": 1e-3, "act1": 2e-3, "fc2": 3e-3, "act2": 4e-3, "head": 1e-2}
    before = ("fc1", "act1", "fc2")
    return [
        (name, Kind.GRAD, "out", scale * (grown if name in before else 1.0))
        for name, scale in usual.items()
    ]


def test_an_output_gradient_that_climbs_past_its_usual_scale_at_two_steps_in_a_row_explodes():
    # fc2's gradient grows while the layers after it stay as they were: 8 times its usual
    # (the median of its last steps) at step 2, far below ``growth`` (50) and past ``climb``
    # (5). Once is noise, and a jump that then stays is no climb; growing again at step 3 (16
    # times the median of 1, 1, 8) is a gradient that feeds itself, said at fc2, where it
    # starts: the layers before it only follow.
    usual = {0: _gradients(1.0), 1: _gradients(1.0)}
    assert not _alerts({**usual, 2: _gradients(8.0), 3: _gradients(1.0)}, "exploding_grad")
    assert not _alerts({**usual, 2: _gradients(8.0), 3: _gradients(8.0)}, "exploding_grad")
    [alert] = _alerts({**usual, 2: _gradients(8.0), 3: _gradients(16.0)}, "exploding_grad")
    assert (alert.module, alert.step, alert.threshold) == ("fc2", 3, 5.0)
    assert alert.value == 16.0
    assert "at 2 recorded steps in a row: a gradient that feeds itself" in alert.message


def test_a_jump_at_once_needs_two_earlier_steps_and_a_climb_one():
    # With one step in 10 recorded, step 10 has step 0 alone before it: fc2's gradient 100
    # times that is no jump at once yet (a head's input gradient grows with its weights from
    # their start), but rising again at step 20 it is a climb from step 0 on.
    jumped = {0: _gradients(1.0), 10: _gradients(100.0)}
    assert _alerts(jumped, "exploding_grad") == []
    climbed = {**jumped, 20: _gradients(1000.0)}
    alerts = _alerts(climbed, "exploding_grad")
    assert [(a.module, a.step, a.threshold) for a in alerts] == [("fc2", 20, 5.0)]


def _outputs(scales: dict[str, float]) -> Rows:
    return [(name, Kind.ACTIVATION, "out", scale) for name, scale in scales.items()]


def test_an_output_far_past_its_start_at_its_only_recorded_step_drifts_there():
    # The default schedule: steps 0-9, then 100. The next recorded step may never come.
    steps = {step: _outputs({"fc1": 1.0, "fc2": 1.0}) for step in range(10)}
    steps[100] = _outputs({"fc1": 300.0, "fc2": 30.0})
    alerts = _alerts(steps, "activation_drift")
    assert [(a.module, a.step, a.value) for a in alerts] == [("fc1", 100, 300.0)]


def test_an_output_that_climbs_step_after_step_drifts_before_it_reaches_the_factor():
    # fc1 doubles at each recorded step from step 60: 16 times its start at step 90, the
    # fourth rise in a row. fc2 wakes up as healthy layers do, 3 times larger at three
    # recorded steps in a row (27 times its start), then stays: neither 100 times its start
    # nor climbing.
    fc1 = [1.0] * 6 + [2.0, 4.0, 8.0, 16.0, 32.0]
    fc2 = [1.0] * 3 + [3.0, 9.0, 27.0] + [27.0] * 5
    steps = {
        10 * index: _outputs({"fc1": first, "fc2": second})
        for index, (first, second) in enumerate(zip(fc1, fc2, strict=True))
    }
    alerts = _alerts(steps, "activation_drift")
    assert [(a.module, a.step, a.value, a.threshold) for a in alerts] == [("fc1", 90, 16.0, 10.0)]
    assert "1.5 times or more at each of its last 4 recorded steps" in alerts[0].message
