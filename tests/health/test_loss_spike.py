"""``loss_spike`` on logged losses: divergence after an early fall, jumps that fall back."""

from __future__ import annotations

import pytest

from layerscope.health import HealthMonitor, parse_alerts

# A post-LN transformer at a pre-LN recipe's rate: its loss falls for 15 steps, then climbs
# (1.3 times its low of step 15 by step 19) and keeps climbing.
DIVERGING = [
    3.25, 2.87, 2.61, 2.32, 2.15, 1.93, 1.90, 1.84, 1.73, 1.74, 1.83, 1.73, 1.73, 1.80, 1.75,
    1.66, 1.79, 1.94, 1.98, 2.20, 2.14, 2.24, 2.35, 2.86, 3.21, 3.40, 3.20, 3.21, 3.18, 3.14,
]  # fmt: skip
# A ResNet whose head is replaced at step 30: the loss jumps to ln 10 and falls back.
NEW_HEAD = [
    2.35, 2.21, 2.08, 1.97, 1.85, 1.82, 1.63, 1.74, 1.60, 1.61, 1.57, 1.36, 1.27, 1.39, 1.21,
    1.16, 1.06, 1.15, 1.15, 0.987, 1.07, 1.01, 0.905, 0.937, 0.906, 0.808, 0.978, 0.924, 0.83,
    0.686, 2.64, 2.56, 2.29, 2.00, 2.19, 1.94, 1.86, 1.95, 1.62, 1.68, 1.76, 1.51, 1.54, 1.48,
]  # fmt: skip


def _spikes(losses: list[float], **options: object) -> list[tuple[int, str]]:
    monitor = HealthMonitor(parse_alerts({"loss_spike": options}), [])
    alerts = monitor.observe([], [(step, "loss", loss) for step, loss in enumerate(losses)])
    return [(alert.step, alert.message) for alert in alerts if alert.rule == "loss_spike"]


def test_a_loss_that_climbs_after_its_early_fall_is_caught_where_it_starts_to():
    [(step, message)] = _spikes(DIVERGING)
    assert step == 19
    assert "climbed at step 19: 2.2, 1.26 times its recent low 1.74" in message


def test_a_jump_that_falls_back_is_not_divergence_unless_it_is_large():
    assert _spikes(NEW_HEAD) == []
    # Five times the low (the least median of 7 values in a row, 0.93) at once is a spike.
    [(step, message)] = _spikes([*NEW_HEAD[:30], 0.93 * 6, *NEW_HEAD[31:]])
    assert step == 30
    assert "spiked at step 30" in message


@pytest.mark.parametrize("losses", [[-1.0] * 30, [0.0] * 30])
def test_a_loss_that_is_not_positive_is_not_judged(losses):
    assert _spikes([*losses, 5.0, 10.0, 50.0]) == []
