"""Parameters that stop learning mid-run are named with the step and the reason; parameters
that never learned from the start (a freeze meant before training) raise no warning."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from pathologies import mlp
from torch import nn

import layerscope
from layerscope.health._stalled import StalledParameters
from layerscope.hooks import stalled_parameters


def _train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    before: Callable[[int], None] = lambda step: None,
    every: int = 1,
    capture: tuple[str, ...] = ("weight", "weight_grad"),
) -> layerscope.Scope:
    generator = torch.Generator().manual_seed(0)
    alerts = {"update_ratio": {}}  # this rule alone
    rules = {name: False for name in layerscope.health.RULES if name != "update_ratio"}
    with layerscope.watch(
        model, optimizer=optimizer, every=every, kinds=capture, alerts={**rules, **alerts}
    ) as scope:
        for step in range(steps):
            before(step)
            x = torch.randn(16, 8, generator=generator)
            (model(x) - x[:, :1]).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    return scope


def _said(scope: layerscope.Scope, severity: str = "warning") -> list[tuple[int, str, str]]:
    alerts = scope.frame("alerts")
    alerts = alerts[alerts.severity == severity]
    return sorted(zip(alerts.step, alerts.module, alerts.tensor, strict=True))


def _message(scope: layerscope.Scope) -> str:
    return str(scope.frame("alerts").message.iloc[0])


@pytest.mark.parametrize("capture", [("weight",), ("weight", "update")])
def test_a_layer_frozen_mid_run_is_named_at_the_next_recorded_step(capture):
    model = mlp([8, 16, 16, 1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def before(step: int) -> None:
        if step == 5:
            model[2].requires_grad_(False)

    scope = _train(model, optimizer, 12, before, every=4, capture=capture)
    assert _said(scope) == [(8, "2", "bias"), (8, "2", "weight")]
    message = _message(scope)
    assert "learned until step 4" in message
    assert "requires_grad is False" in message
    assert "although its gradient is not zero" not in message


def test_a_freeze_before_training_is_no_finding_even_with_updates_recorded():
    model = mlp([8, 16, 16, 1])
    model[0].requires_grad_(False)  # a backbone frozen on purpose, left in the optimizer
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scope = _train(model, optimizer, 6, capture=("weight", "weight_grad", "update"))
    assert scope.frame("alerts").empty


def test_a_group_whose_learning_rate_goes_to_zero_is_named():
    model = mlp([8, 16, 16, 1])
    head = list(model[4].parameters())
    rest = [p for p in model.parameters() if all(p is not h for h in head)]
    optimizer = torch.optim.Adam([{"params": rest}, {"params": head}], lr=1e-3)

    def before(step: int) -> None:
        if step == 3:
            optimizer.param_groups[1]["lr"] = 0.0

    scope = _train(model, optimizer, 6, before)
    assert _said(scope) == [(3, "4", "bias"), (3, "4", "weight")]
    assert "learning rate of 0" in _message(scope)


def test_a_warm_up_from_a_learning_rate_of_zero_is_no_finding():
    model = mlp([8, 16, 1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def before(step: int) -> None:
        optimizer.param_groups[0]["lr"] = 0.01 * step / 4

    scope = _train(model, optimizer, 6, before, capture=("weight", "update"))
    assert scope.frame("alerts").empty


@pytest.mark.parametrize("stepped", [False, True], ids=["left-out", "added"])
def test_a_module_replaced_after_watch_is_named(stepped):
    model = mlp([8, 16, 16, 1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def before(step: int) -> None:
        if step == 2:
            model[4] = nn.Linear(16, 1)
            if stepped:
                optimizer.add_param_group({"params": list(model[4].parameters())})

    scope = _train(model, optimizer, 5, before, capture=("weight", "weight_grad", "update"))
    if stepped:  # the new module learns: a note that it is not watched, no warning
        assert _said(scope) == []
        assert [step for step, _, _ in _said(scope, "info")] == [2]
        assert "not watched" in _message(scope)
    else:  # one alert for the module, not one per parameter
        assert [(step, module) for step, module, _ in _said(scope)] == [(2, "4")]
        assert "in none of the optimizer's parameter groups" in _message(scope)


def test_the_reasons_read_from_the_model_and_its_optimizer():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    first, second, third, _ = model
    sgd = torch.optim.SGD(
        [{"params": [first.weight, second.weight, second.bias]}, {"params": third.parameters()}],
        lr=0.1,
    )
    sgd.param_groups[1]["lr"] = 0.0
    model(torch.ones(1, 2)).sum().backward()
    second.bias.requires_grad_(False)
    targets = [(str(index), module) for index, module in enumerate(model)]
    model[3] = nn.Linear(2, 2)  # after watch(): the old one stays the watched one
    assert stalled_parameters(model, targets, [sgd]) == {
        ("0", "bias"): "no_group",
        ("1", "bias"): "frozen",
        ("2", "weight"): "zero_lr",
        ("2", "bias"): "zero_lr",
        ("3", "weight"): "replaced_left_out",
        ("3", "bias"): "replaced_left_out",
    }
    assert stalled_parameters(model, targets[3:], []) == {
        ("3", "weight"): "replaced_left_out",
        ("3", "bias"): "replaced_left_out",
    }


def test_notes_are_read_in_step_order_and_tell_when_a_parameter_last_learned():
    stalled = StalledParameters()
    stalled.note(4, {("a", "weight"): "frozen"})
    stalled.note(0, {})
    assert stalled.at(2) == {}
    assert stalled.at(9) == {("a", "weight"): "frozen"}
    assert stalled.stall(("a", "weight"), "frozen").since == 0
