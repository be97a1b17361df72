"""``loss_collapse`` on logged losses: a shortcut found at once, not a fast healthy fall."""

from __future__ import annotations

from layerscope.health import HealthMonitor, parse_alerts

# An MLP on the digits whose labels all become class 0 at step 40: the loss jumps, then
# collapses 300 times in a few steps.
ONE_CLASS = [
    2.29, 2.31, 2.28, 2.24, 2.25, 2.23, 2.28, 2.19, 2.21, 2.18, 2.16, 2.14, 2.10, 2.07, 1.99,
    2.02, 1.98, 1.95, 1.94, 1.84, 1.87, 1.80, 1.74, 1.73, 1.72, 1.54, 1.59, 1.57, 1.50, 1.42,
    1.45, 1.33, 1.23, 1.30, 1.14, 1.08, 1.05, 0.953, 0.971, 0.892, 3.23, 2.41, 2.04, 1.06,
    0.522, 0.136, 0.0599, 0.0317, 0.00533, 0.00532, 0.00057, 0.000286, 0.00047, 9.06e-05,
]  # fmt: skip
# A new head on a pretrained backbone: the loss falls 20 times in 30 steps, as fast as
# training goes.
NEW_HEAD = [
    2.39, 2.12, 1.73, 1.46, 1.28, 1.01, 0.872, 0.76, 0.626, 0.70, 0.382, 0.396, 0.363, 0.342,
    0.293, 0.302, 0.22, 0.24, 0.248, 0.161, 0.165, 0.191, 0.152, 0.136, 0.221, 0.142, 0.115,
    0.17, 0.134, 0.107,
]  # fmt: skip


def _collapses(losses: list[float]) -> list[tuple[int, str]]:
    monitor = HealthMonitor(parse_alerts(True), [])
    alerts = monitor.observe([], [(step, "loss", loss) for step, loss in enumerate(losses)])
    return [(alert.step, alert.message) for alert in alerts if alert.rule == "loss_collapse"]


def test_a_loss_that_collapses_is_caught_once_where_it_falls_five_times():
    # Step 45: 0.136, 7.8 times below the median of steps 38-44 (1.06); it keeps falling,
    # one episode.
    [(step, message)] = _collapses(ONE_CLASS)
    assert step == 45
    assert "collapsed at step 45: 0.136, 7.79 times below its level" in message


def test_a_fast_healthy_fall_is_not_a_collapse():
    assert _collapses(NEW_HEAD) == []
    assert _collapses(ONE_CLASS[:44]) == []  # the jump up of step 40 is not one either
