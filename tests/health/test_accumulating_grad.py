"""``accumulating_grad``: optimizer steps that apply a gradient zero_grad() left uncleared."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import layerscope
from layerscope.health import CARRIED_SCALAR, parse_alerts
from layerscope.health._accumulating_grad import AccumulatingGrad

Clear = Callable[[nn.Module, torch.optim.Optimizer, int], None]


def _train(clear: Clear, steps: int = 6, passes: int = 1) -> tuple[list[tuple], list[int]]:
    """Train a small model with ``clear`` after each optimizer step.

    Returns its alerts and the steps whose gradient carried the last step's (a zero value:
    only a value could tell that it was cleared).
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, run=None, every=2) as scope:
        for step in range(steps):
            for _ in range(passes):  # micro-batches: one optimizer step for all of them
                model(torch.randn(16, 4)).pow(2).mean().backward()
            optimizer.step()
            clear(model, optimizer, step)
            scope.step()
    alerts = scope.frame("alerts")
    said = list(zip(alerts.rule, alerts.module, alerts.tensor, alerts.step, strict=True))
    scalars = scope.frame("scalars")
    carried = scalars[(scalars.name == CARRIED_SCALAR) & (scalars.value > 0)]
    return said, carried.step.tolist()


def _until(last: int, clear: Clear) -> Clear:
    """``clear`` after the optimizer steps before step ``last``, then never."""

    def clear_until(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        if step < last:
            clear(model, optimizer, step)

    return clear_until


def _zero_grad(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    optimizer.zero_grad()


@pytest.mark.parametrize(
    "clear",
    [
        pytest.param(_zero_grad, id="zero_grad"),
        pytest.param(lambda m, o, s: o.zero_grad(set_to_none=False), id="set_to_none=False"),
        pytest.param(lambda m, o, s: m.zero_grad(), id="model.zero_grad"),
        pytest.param(
            lambda m, o, s: [p.grad.data.zero_() for p in m.parameters()],  # hides its version
            id="grad.data.zero_",
        ),
    ],
)
def test_a_missing_clearing_is_named_at_the_first_step_that_applies_a_sum(clear: Clear):
    said, carried = _train(_until(2, clear))  # cleared after steps 0 and 1, then never
    # Step 3 is not recorded (every=2): the finding needs no recorded step.
    assert carried == [3, 4, 5]
    assert said == [("accumulating_grad", "0", "weight", 3)]  # one alert for the episode


def test_micro_batches_are_summed_within_a_step_only():
    said, carried = _train(_until(3, _zero_grad), passes=3)
    assert carried == [4, 5]
    assert [alert[3] for alert in said] == [4]


def test_a_gradient_added_to_after_the_step_and_cleared_before_the_next_is_healthy():
    # A GAN's discriminator: the generator's backward adds to its gradient after its step,
    # and zero_grad() clears it before its next backward; until step 3, where it does not.
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, run=None, every=1) as scope:
        for step in range(5):
            if step != 3:
                optimizer.zero_grad(set_to_none=False)
            model(torch.randn(8, 4)).mean().backward()
            optimizer.step()
            model(torch.randn(8, 4)).mean().backward()  # the other player's loss
    alerts = scope.frame("alerts")
    assert list(zip(alerts.rule, alerts.step, strict=True)) == [("accumulating_grad", 3)]


def test_the_rule_alerts_once_per_episode_and_not_on_a_cleared_value():
    rule = AccumulatingGrad(("encoder.0", "weight"))
    first = rule.observe_scalars([(5, "loss", 1.0), (5, CARRIED_SCALAR, 0.0)])
    assert first == []  # zero: cleared after all
    opened = rule.observe_scalars([(6, CARRIED_SCALAR, 0.25), (7, CARRIED_SCALAR, 0.5)])
    assert [(a.step, a.module, a.tensor, a.severity) for a in opened] == [
        (6, "encoder.0", "weight", "warning")
    ]
    assert "encoder.0.weight" in opened[0].message
    assert "zero_grad()" in opened[0].message
    assert rule.observe_scalars([(27, CARRIED_SCALAR, 0.5)]) == []  # 20 steps: same episode
    assert [a.step for a in rule.observe_scalars([(48, CARRIED_SCALAR, 0.5)])] == [48]


def test_it_is_on_by_default_and_can_be_left_out():
    assert parse_alerts(True).rules["accumulating_grad"] == {}
    assert "accumulating_grad" not in parse_alerts({"accumulating_grad": False}).rules
