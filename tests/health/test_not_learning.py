"""``not_learning`` on logged losses: a loss that never fell from its start, and the healthy
runs that only start slowly, fall and stop, or have no loss to judge."""

from __future__ import annotations

import math

import pytest
import torch

from layerscope.health import HealthMonitor, parse_alerts
from layerscope.hooks._rate_bounds import RateBounds

# An MLP on the digits whose labels come from a second sampler: the loss stays at ln 10.
SHUFFLED = [
    2.294, 2.328, 2.290, 2.309, 2.336, 2.343, 2.322, 2.320, 2.333, 2.285, 2.304, 2.297, 2.306,
    2.306, 2.287, 2.296, 2.313, 2.310, 2.318, 2.319, 2.309, 2.305, 2.302, 2.306, 2.308, 2.302,
    2.291, 2.312, 2.312, 2.296, 2.321, 2.313, 2.308, 2.297, 2.303, 2.293, 2.289, 2.308, 2.303,
    2.309, 2.295, 2.304, 2.312, 2.300, 2.315, 2.327, 2.309, 2.321, 2.305, 2.304, 2.306, 2.304,
    2.300, 2.308, 2.312, 2.320, 2.294, 2.310, 2.307, 2.311, 2.301, 2.293, 2.300, 2.296, 2.296,
    2.295, 2.316, 2.281, 2.306, 2.325, 2.320, 2.299, 2.322, 2.323, 2.309, 2.292, 2.297, 2.292,
    2.297, 2.292, 2.283, 2.302, 2.303, 2.304, 2.290, 2.321, 2.291, 2.309, 2.312, 2.300, 2.298,
    2.324, 2.299, 2.296, 2.298, 2.302, 2.292, 2.308, 2.290, 2.311,
]  # fmt: skip
# Ten Linear and ReLU layers at PyTorch's default initialisation: the signal is faint through
# them, and the loss stays at ln 10 for 40 steps before it falls (healthy, only slow).
SLOW_START = [
    2.303, 2.308, 2.288, 2.316, 2.284, 2.291, 2.343, 2.269, 2.341, 2.331, 2.301, 2.310, 2.296,
    2.296, 2.300, 2.280, 2.285, 2.330, 2.257, 2.317, 2.304, 2.323, 2.278, 2.321, 2.305, 2.289,
    2.269, 2.312, 2.285, 2.293, 2.308, 2.282, 2.281, 2.298, 2.293, 2.294, 2.313, 2.297, 2.250,
    2.281, 2.270, 2.240, 2.210, 2.194, 2.158, 2.165, 2.013, 1.933, 1.976, 1.854, 1.854, 1.751,
    2.164, 2.151, 1.915, 1.593, 2.141, 1.923, 1.983, 1.836, 1.647, 1.914, 1.799, 1.836, 1.741,
    1.819, 1.955, 1.796, 1.798, 1.755, 1.844, 1.694, 1.751, 1.722, 1.887, 1.784, 1.797, 1.659,
    1.719, 1.778, 1.922, 1.583, 1.759, 1.631, 1.764, 1.711, 1.706, 1.739, 1.862, 1.720, 1.809,
    1.600, 1.633, 1.669, 1.984, 1.867, 1.771, 1.959, 1.890, 1.660,
]  # fmt: skip


def _said(losses: list[float], **options: object) -> list[tuple[int, str, str]]:
    monitor = HealthMonitor(parse_alerts({"not_learning": options}), [])
    alerts = monitor.observe([], [(step, "loss", loss) for step, loss in enumerate(losses)])
    return [(a.step, a.severity, a.message) for a in alerts if a.rule == "not_learning"]


def test_a_loss_that_never_falls_is_noted_then_warned_of_once():
    [(note, info, noted), (warned, warning, message)] = _said(SHUFFLED + SHUFFLED)
    assert (note, info) == (19, "info")  # the 20th value
    assert "in 20 steps" in noted
    assert "a plateau before the loss starts to fall" in noted  # still likely, this early
    assert "plateau before" not in message
    assert (warned, warning) == (99, "warning")  # the 100th, and nothing after
    assert "has not fallen from its start in 100 steps: 2.298" in message
    assert "against 2.309 at steps 0-4" in message
    assert "labels belong to their inputs" in message


def test_a_slow_start_that_then_falls_is_only_noted():
    assert [(step, severity) for step, severity, _ in _said(SLOW_START)] == [(19, "info")]


def test_a_loss_that_fell_and_then_stopped_or_climbed_back_learned():
    fell = [2.3 * 0.9**step for step in range(20)]  # to 0.31
    climbed = [0.31 * 1.03**step for step in range(80)]  # back up to 3.2
    assert _said(fell + [fell[-1]] * 80) == []
    assert _said(fell + climbed) == []


def test_losses_it_cannot_judge_are_left_alone():
    assert _said([*SHUFFLED[:10], -1.0, *SHUFFLED]) == []  # no log scale from there
    diverged = [2.3 * 1.1**step for step in range(20)] + [2.3 * 6] * 80  # loss_spike's
    assert _said(diverged) == []
    noisy = [2.3 * math.exp(0.3 * math.sin(step * 2.1)) for step in range(100)]
    assert _said(noisy) == []  # too noisy to tell a 5% fall from none
    assert _said(SHUFFLED, warning_steps=0) == [(19, "info", _said(SHUFFLED)[0][2])]


def _said_with_output(
    losses: list[float],
    spread: float = 0.34,
    width: int = 10,
    rates: list[float] | None = None,
) -> list[tuple[int, str, str]]:
    """What a run says whose first ten steps are recorded: its output's spread and width,
    and its optimizer's rate at each (``rates``; None: no rate noted, as of plain SGD)."""
    monitor = HealthMonitor(parse_alerts(True), [])
    scalars: list[tuple[int, str, float]] = []
    for step, loss in enumerate(losses):
        if step < 10:
            if rates is not None:
                monitor.note_rates(
                    step,
                    RateBounds(
                        (("fc", "weight"),), ("Adam",), (rates[step],), (torch.tensor(1.0),), (100,)
                    ),
                )
            monitor.note_output(step, torch.tensor(spread), width)
        scalars.append((step, "loss", loss))
    alerts = monitor.observe([], scalars)
    return [(a.step, a.severity, a.message) for a in alerts if a.rule == "not_learning"]


def test_a_classifier_at_chance_whose_output_follows_its_inputs_is_warned_of_early():
    [(step, severity, message)] = _said_with_output(SHUFFLED, rates=[3e-3] * 10)
    assert (step, severity) == (19, "warning")  # the 20th value, and nothing after
    assert "do not follow its inputs as far as it can tell: it started at chance (ln 10" in message
    assert "a spread of 0.34 at step 9" in message
    assert "its rate has not risen since step 0" in message
    assert "plateau before" not in message


@pytest.mark.parametrize(
    ("losses", "reading"),
    [
        (SHUFFLED, {"spread": 0.005, "rates": [3e-3] * 10}),  # the same output for all: a plateau
        (SHUFFLED, {"rates": [3e-4 * (step + 1) for step in range(10)]}),  # a warm-up
        (SHUFFLED, {}),  # no rate noted: it may be warming up
        (SHUFFLED, {"rates": [0.0] * 10}),  # not stepped at all
        ([loss / 2 for loss in SHUFFLED], {"rates": [3e-3] * 10}),  # far below chance: resumed
        (SHUFFLED, {"width": 1, "rates": [3e-3] * 10}),  # no classes
    ],
)
def test_what_does_not_show_the_targets_do_not_follow_keeps_it_a_note(losses, reading):
    said = _said_with_output(losses, **reading)
    assert [(step, severity) for step, severity, _ in said] == [(19, "info"), (99, "warning")]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"warning_steps": 2.5}, r"\['warning_steps'\]: expected a whole number"),
        ({"fall": 1.5}, r"\['fall'\]: expected a value from 0 to 1"),
        ({"baseline": 0}, r"\['baseline'\]: expected a value from 1 to 1000"),
    ],
)
def test_its_options_are_bounded(options, match):
    with pytest.raises(ValueError, match=r"alerts\['not_learning'\]" + match):
        parse_alerts({"not_learning": options})


def test_two_optimizers_at_steady_rates_are_not_a_rate_that_rose():
    # A GAN's two optimizers note their rates in turn at each recorded step: the higher
    # rate's latest note against the first step's first (the lower rate) is no rise.
    monitor = HealthMonitor(parse_alerts(True), [])
    scalars: list[tuple[int, str, float]] = []
    for step, loss in enumerate(SHUFFLED):
        if step < 10:
            for rate in (1e-4, 3e-3):
                bounds = RateBounds(
                    (("fc", "weight"),), ("Adam",), (rate,), (torch.tensor(1.0),), (100,)
                )
                monitor.note_rates(step, bounds)
            monitor.note_output(step, torch.tensor(0.34), 10)
        scalars.append((step, "loss", loss))
    said = [(a.step, a.severity) for a in monitor.observe([], scalars) if a.rule == "not_learning"]
    assert said == [(19, "warning")]


def test_a_later_steps_reading_does_not_judge_an_earlier_loss():
    # The training thread notes step 100's output while the writer still judges step 19's
    # loss: a plateau's output at steps 0-9 keeps it a note, whatever the model did later.
    monitor = HealthMonitor(parse_alerts(True), [])
    for step in (*range(10), 100):
        bounds = RateBounds((("fc", "weight"),), ("Adam",), (3e-3,), (torch.tensor(1.0),), (100,))
        monitor.note_rates(step, bounds)
        monitor.note_output(step, torch.tensor(0.005 if step < 10 else 0.4), 10)
    scalars = [(step, "loss", loss) for step, loss in enumerate(SHUFFLED[:20])]
    said = [(a.step, a.severity) for a in monitor.observe([], scalars) if a.rule == "not_learning"]
    assert said == [(19, "info")]
