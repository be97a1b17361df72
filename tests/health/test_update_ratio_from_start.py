"""A learning rate far too high is found at the first step on weight matrices; parameters
that start at zero keep the warm-up."""

from __future__ import annotations

import pytest
import torch
from pathologies import mlp, train
from torch import nn

import layerscope


def test_a_rate_far_too_high_is_found_at_the_first_step_but_not_on_a_layer_from_zero():
    model = mlp([8, 16, 16, 1])
    with torch.no_grad():  # a layer initialised to zero: its first update is its whole size
        nn.init.zeros_(model[2].weight)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    alerts = dict.fromkeys(("dead", "vanishing_grad", "exploding_grad"), False)
    scope = train(
        model, 11, optimizer=optimizer, every=10, kinds=("weight", "update"), alerts=alerts
    )  # records 0 and 10
    found = scope.frame("alerts")
    found = found[(found.rule == "update_ratio") & (found.step == 0)]
    # Layer 2 starts at zero, and no gradient reaches layer 0 through it at step 0.
    assert set(zip(found.module, found.tensor, strict=True)) == {("4", "weight")}
    assert (found.value > 0.8).all()
    assert "steps too large" in found.message.iloc[0]


def _bound_alerts(model, optimizer, steps=3, every=10):
    alerts = dict.fromkeys(("dead", "vanishing_grad", "exploding_grad", "activation_drift"), False)
    scope = train(model, steps, optimizer=optimizer, every=every, alerts=alerts)
    found = scope.frame("alerts")
    return found[found.rule == "update_ratio"]


def test_without_update_rows_an_adaptive_rate_over_the_weights_size_is_found_at_once():
    model = mlp([8, 16, 16, 1])
    with torch.no_grad():
        rms = [float(layer.weight.double().pow(2).mean().sqrt()) for layer in model[::2]]
        nn.init.zeros_(model[2].weight)  # starts at zero: its first steps are its whole size
    found = _bound_alerts(model, torch.optim.AdamW(model.parameters(), lr=0.5))
    assert set(zip(found.module, found.tensor, found.step, strict=True)) == {
        ("0", "weight", 0),
        ("4", "weight", 0),
    }  # one alert each, at the first recorded step, though 0 and 10 are recorded
    first = found[found.module == "0"].iloc[0]
    assert first.value == pytest.approx(0.5 / rms[0], rel=1e-5)  # the rate over the RMS before
    assert "AdamW at lr=0.5" in first.message
    assert "try lr near" in first.message


@pytest.mark.parametrize(
    ("optimizer", "lr"), [(torch.optim.Adam, 3e-3), (torch.optim.SGD, 0.5), (torch.optim.Adam, 0.0)]
)
def test_a_usual_rate_a_plain_sgd_and_a_zero_rate_are_no_finding(optimizer, lr):
    model = mlp([8, 16, 16, 1])
    assert _bound_alerts(model, optimizer(model.parameters(), lr=lr)).empty


def test_a_rate_that_rose_between_recorded_steps_is_judged_against_the_weight_before():
    # At step 12 a schedule lifts the rate 1,000 times; by the next recorded step (20) eight
    # large steps have grown the weights past it: against the RMS of step 10 it is flagged.
    model = mlp([8, 16, 16, 1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    alerts = dict.fromkeys(("dead", "vanishing_grad", "exploding_grad", "activation_drift"), False)
    generator = torch.Generator().manual_seed(0)
    rms_at_10 = {}
    with layerscope.watch(model, optimizer=optimizer, every=10, alerts=alerts) as scope:
        for step in range(21):
            if step == 10:
                rms_at_10 = {f"{i}": float(model[i].weight.double().pow(2).mean().sqrt())
                             for i in (0, 2, 4)}  # fmt: skip
            if step == 12:
                optimizer.param_groups[0]["lr"] = 1.0
            if step == 20:
                grown = {f"{i}": float(model[i].weight.double().pow(2).mean().sqrt())
                         for i in (0, 2, 4)}  # fmt: skip
            x = torch.randn(32, 8, generator=generator)
            (model(x) - x[:, :1]).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    assert all(rms > 1.0 for rms in grown.values())  # no longer below the rate itself
    found = scope.frame("alerts")
    found = found[found.rule == "update_ratio"]
    assert sorted(found.module) == ["0", "2", "4"]
    assert set(found.step) == {20}
    first = found[found.module == "0"].iloc[0]
    assert first.value == pytest.approx(1.0 / rms_at_10["0"], rel=1e-5)
    assert "its RMS at step 10" in first.message
    assert "when the rate was 0.001" in first.message


@pytest.mark.filterwarnings("error::layerscope.LayerscopeWarning")  # no reading may fail
def test_float64_and_float16_weights_are_bounded_in_their_own_precision():
    model = mlp([8, 16, 16, 1])
    model[0].double()
    model[2].half()
    with torch.no_grad():
        rms = [float(layer.weight.double().pow(2).mean().sqrt()) for layer in model[::2]]

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            x = self.body[1](self.body[0](x.double())).half()
            return self.body[4](self.body[3](self.body[2](x)).float())

    mixed = Mixed()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5, eps=1e-3)  # eps float16 holds
    with layerscope.watch(mixed, optimizer=optimizer, every=10, alerts={"dead": False}) as scope:
        for _ in range(2):
            mixed(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    found = scope.frame("alerts")
    found = found[(found.rule == "update_ratio") & found.message.str.contains("lr=0.5")]
    values = dict(zip(found.module, found.value, strict=True))
    expected = {f"body.{i}": 0.5 / size for i, size in zip((0, 2, 4), rms, strict=True)}
    assert values == pytest.approx(expected, rel=1e-3)
