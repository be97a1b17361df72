"""Each planted pathology is found by the right rule, at the right module and step; a healthy
run raises no alert at warning level."""

from __future__ import annotations

import logging

import pytest
import torch
from pathologies import BlowUp, NaNInBackward, mlp, train
from torch import nn

import layerscope


def _alerts(scope: layerscope.Scope, rule: str | None = None):
    alerts = scope.frame("alerts")
    return alerts if rule is None else alerts[alerts.rule == rule]


def test_a_division_by_zero_is_found_at_its_step_and_module_by_the_sentinel():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), BlowUp(at=13), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)
    )
    schedule = layerscope.Schedule(every=10, sentinel=True)  # step 13 is not recorded
    scope = train(model, 20, every=schedule)
    [alert] = _alerts(scope, "nonfinite").itertuples()
    assert (alert.step, alert.module, alert.kind) == (13, "2", "activation")
    assert alert.severity == "error"
    assert "at step 13" in alert.message
    assert "2 (BlowUp)" in alert.message


def test_without_the_sentinel_the_first_non_finite_loss_dates_the_episode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), BlowUp(at=13), nn.Linear(16, 1))
    scope = train(model, 21, every=layerscope.Schedule(every=10, sentinel=False))
    # The loss, logged every step, is NaN from step 13; no layer was watched then, and the
    # recorded step 20 is the same episode: one alert, naming no layer.
    [alert] = _alerts(scope, "nonfinite").itertuples()
    assert (alert.step, alert.module, alert.tensor) == (13, "", "loss")
    assert "the loss is nan (finite at step 12" in alert.message
    assert "the last watched: step 10" in alert.message
    assert "Schedule(sentinel=True)" in alert.message


def test_a_backward_that_returns_nan_is_found_in_backward_order():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), NaNInBackward(at=4), nn.Tanh(),
        nn.Linear(16, 1),
    )  # fmt: skip
    scope = train(model, 8)
    [alert] = _alerts(scope, "nonfinite").itertuples()
    assert alert.step == 4
    # The NaN leaves NaNInBackward's backward: the gradient of the module before it is the
    # first non-finite one in backward order.
    assert (alert.module, alert.kind) == ("2", "grad")
    assert "forward pass was finite" in alert.message
    assert "3 (NaNInBackward)" in alert.message


def test_a_relu_layer_driven_dead_is_found():
    model = mlp([8, 32, 32, 1])
    with torch.no_grad():
        model[2].bias.fill_(-100.0)  # the second ReLU's inputs: all negative
    scope = train(model, 6)
    dead = _alerts(scope, "dead")
    assert set(dead.module) == {"3"}
    # The ReLU's whole output (32 samples of 32 units) is zero: two recorded steps, 0 and 1.
    assert dead.step.tolist() == [1]
    assert (dead.value >= 0.99).all()


def test_a_dead_layer_is_found_and_not_the_flatten_and_dropout_that_pass_its_zeros_on():
    model = mlp([8, 32, 32, 1])
    model.insert(4, nn.Dropout(0.0))  # after the second ReLU: its zeros pass through
    model.insert(5, nn.Flatten())
    with torch.no_grad():
        model[2].bias.fill_(-100.0)
    scope = train(model, 6)
    frame = scope.frame()
    passed_on = frame[frame.module.isin(["4", "5"]) & (frame.kind == "activation")]
    assert (passed_on.zero_frac == 1.0).all()  # all zero, as the ReLU's output
    assert set(_alerts(scope, "dead").module) == {"3"}


def test_a_deep_sigmoid_stack_has_vanishing_gradients_in_its_first_layers():
    model = mlp([8] + [32] * 20 + [1], activation=nn.Sigmoid)
    scope = train(model, 3)
    vanishing = _alerts(scope, "vanishing_grad")
    layers = {int(module) for module in vanishing.module}
    assert 0 in layers  # the first layers: modules 0 to 40, Linear at even places
    assert max(layers) <= 30  # not the last ones, whose gradients are those of the loss
    assert not len(_alerts(scope, "exploding_grad"))


def test_a_deep_linear_stack_with_too_large_weights_has_exploding_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32, bias=False) for _ in range(12)])
    with torch.no_grad():
        for layer in model:
            nn.init.normal_(layer.weight, std=0.6)  # gain about 3.4 a layer
    scope = train(model, 3, inputs=32, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    exploding = _alerts(scope, "exploding_grad")
    assert "0" in set(exploding.module)  # the first layer's gradient is the largest
    assert not len(_alerts(scope, "vanishing_grad"))


def test_a_layer_left_out_of_the_optimizer_has_an_update_ratio_of_zero():
    model = mlp([8, 16, 16, 1])
    kept = [p for name, p in model.named_parameters() if not name.startswith("2.")]
    scope = train(model, 4, optimizer=torch.optim.Adam(kept, lr=1e-3))
    ratio = _alerts(scope, "update_ratio")
    assert set(zip(ratio.module, ratio.tensor, strict=True)) == {("2", "weight"), ("2", "bias")}
    assert (ratio.value == 0.0).all()
    assert ratio.step.min() == 0  # noted as left out at the optimizer's step: one step tells
    assert "optimizer's parameter groups" in ratio.message.iloc[0]


def test_measured_update_ratios_far_too_large_are_found():
    model = mlp([8, 16, 1])
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    alerts = {"update_ratio": {"warmup": 0}}  # judged from the first step
    scope = train(model, 4, optimizer=optimizer, kinds=("weight", "update"), alerts=alerts)
    ratio = _alerts(scope, "update_ratio")
    assert len(ratio)
    assert (ratio.value > 0.1).all()


def test_an_activation_whose_scale_grows_a_hundredfold_is_found():
    model = mlp([8, 16, 16, 1])
    with layerscope.watch(model, every=1) as scope:
        for _ in range(10):
            with torch.no_grad():
                model[0].weight.mul_(3.0)  # a runaway layer: 3**5 = 243 by step 5
            model(torch.randn(32, 8)).sum().backward()
            model.zero_grad()
            scope.step()
    drift = _alerts(scope, "activation_drift")
    assert "0" in set(drift.module)
    first = drift[drift.module == "0"].step.min()
    # Against the median of steps 0-4, about 3**2 = 9 times step 0's scale: about 3**5 / 3**2
    # = 27 at step 5, past the square root of 100 and 3 times the step before at each of its
    # last 4 recorded steps: a climb, said before it reaches 100 (at step 7).
    assert first == 5
    assert 10 < drift[drift.module == "0"].value.iloc[0] < 100


def test_a_loss_spike_names_the_layer_that_moved_first():
    model = mlp([8, 16, 16, 1])
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for step in range(40):
            if step == 30:
                with torch.no_grad():
                    model[2].weight.mul_(20.0)  # the middle layer goes wrong first
            x = torch.randn(32, 8, generator=generator)
            loss = (model(x) - x[:, :1]).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    [spike] = _alerts(scope, "loss_spike").itertuples()
    assert spike.step == 30
    assert spike.module == "2"
    assert "spiked at step 30" in spike.message


def _climbing(every: int) -> layerscope.Scope:
    """From step 30 the last layer's weights grow 1.4 times a step: the loss climbs."""
    model = mlp([8, 16, 16, 1])

    def grow(step: int) -> None:
        if step >= 30:
            with torch.no_grad():
                model[4].weight.mul_(1.4)

    return train(model, 42, batch=256, same_batch=True, before=grow, every=every)


def test_a_climb_between_recorded_steps_is_placed_by_the_next_recorded_one():
    # The loss climbs at step 35; only steps 30 and 40 are recorded near it, and step 30 is
    # before the loss's low: its alert names no layer, and one more names the layer at 40.
    spike, named = _alerts(_climbing(every=10), "loss_spike").itertuples()
    assert (spike.step, spike.module) == (35, "")
    assert "no layer recorded since the loss's low (steps 27-33) is 3 times off" in spike.message
    assert (named.step, named.module) == (40, "4")
    assert named.message.startswith("loss climbed at step 35: ")
    assert "; by step 40, the scale moved first in: 4 activation out (from step 40)" in (
        named.message
    )


def test_a_climb_recorded_every_step_names_its_layer_at_once():
    [spike] = _alerts(_climbing(every=1), "loss_spike").itertuples()
    assert (spike.step, spike.module) == (35, "4")


def test_a_loss_that_runs_away_from_its_first_steps_is_a_spike_before_the_warm_up():
    # Plain SGD far too fast on a deep linear stack: the loss climbs from the first steps.
    model = mlp([8, 32, 32, 32, 1], activation=nn.Identity)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    [spike, *_] = _alerts(train(model, 8, optimizer=optimizer), "loss_spike").itertuples()
    assert spike.step < 8
    assert f"climbed from its start at step {spike.step}" in spike.message


def test_a_healthy_model_trained_with_adam_raises_no_warning(caplog):
    model = mlp([8, 32, 32, 1], activation=nn.GELU)
    with caplog.at_level(logging.INFO, logger="layerscope"):
        scope = train(model, 60, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3))
    alerts = _alerts(scope)
    assert alerts[alerts.severity != "info"].empty, alerts.message.tolist()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_parameters_that_start_at_zero_are_not_judged_in_their_first_steps():
    # AdamW moves a zero-initialised bias by about its own size in its first steps.
    model = mlp([8, 16, 16, 1], activation=nn.GELU)
    with torch.no_grad():
        for layer in model[::2]:
            layer.bias.zero_()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scope = train(model, 30, optimizer=optimizer, kinds=("weight", "update"))
    assert _alerts(scope, "update_ratio").empty


def test_an_additive_attention_mask_of_minus_inf_is_not_a_fault():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(16, 2, batch_first=True)
    mask = torch.triu(torch.full((6, 6), float("-inf")), diagonal=1)
    attention.register_buffer("mask", mask)  # kept as a buffer too, as models keep theirs
    capture = ("input", "activation", "buffer")
    with layerscope.watch(attention, every=1, kinds=capture) as scope:
        for _ in range(3):
            x = torch.randn(4, 6, 16)
            attention(x, x, x, attn_mask=mask)[0].sum().backward()
            scope.step()
    assert _alerts(scope, "nonfinite").empty


def test_units_dead_for_the_whole_batch_are_found_with_the_dead_units_statistic():
    model = mlp([8, 32, 32, 1])
    with torch.no_grad():
        model[2].bias[:16] = -100.0  # half the second ReLU's units never fire
    stats = {"dead_units": layerscope.health.dead_units}
    scope = train(model, 5, stats=stats)
    frame = scope.frame()
    second = frame[(frame.module == "3") & (frame.kind == "activation")]
    assert (second.dead_units >= 0.5).all()  # the 16 planted, and any that died on their own
    assert (second.zero_frac < 0.9).all()  # the other half fires: the tensor is not all zero
    dead = _alerts(scope, "dead")
    assert dead.module.tolist() == ["3"]
    assert dead.step.tolist() == [2]
    assert "of the units of its output out are zero for the whole batch" in dead.message[0]


def test_dead_units_counts_features_of_vectors_and_channels_of_images():
    from layerscope.health import dead_units

    features = torch.randn(4, 6, 10)
    features[..., :3] = 0.0
    assert float(dead_units(features)) == pytest.approx(0.3)
    images = torch.randn(2, 8, 5, 5)
    images[:, 2] = 0.0
    images[0, 3] = 0.0  # zero in one sample only: alive
    assert float(dead_units(images)) == pytest.approx(1 / 8)
    assert float(dead_units(torch.zeros(5))) == 0.0  # no units to speak of


def _head_from_zero(steps: int = 101, **watch: object) -> layerscope.Scope:
    """An MLP on random class templates in noise, its head initialised at zero (as timm's
    vision transformers start theirs)."""
    torch.manual_seed(0)
    model = mlp([64, 64, 64, 10])
    with torch.no_grad():
        model[-1].weight.zero_()
        model[-1].bias.zero_()
    generator = torch.Generator().manual_seed(0)
    templates = 0.5 * torch.randn(10, 64, generator=generator)  # learned in 100 steps
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    # Steps 0-9, then 100, by default.
    with layerscope.watch(model, optimizer=optimizer, **watch) as scope:  # type: ignore[arg-type]
        for _ in range(steps):
            y = torch.randint(0, 10, (64,), generator=generator)
            x = templates[y] + torch.randn(64, 64, generator=generator)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return scope


def test_a_head_initialised_at_zero_grows_to_the_models_scale_without_a_drift_alert():
    scope = _head_from_zero()
    outputs = scope.frame()
    head = outputs[(outputs.module == "4") & (outputs.kind == "activation")]
    rms = head.l2 / head.numel**0.5
    start, end = rms[(head.step >= 1) & (head.step <= 5)].median(), rms[head.step == 100].iloc[0]
    assert end / start > 100  # grown far more than the rule's factor from its own start
    assert _alerts(scope).empty


def test_an_output_grown_a_hundredfold_past_the_models_scale_is_still_drift():
    model = mlp([8, 16, 16, 1])
    with torch.no_grad():
        model[-1].weight.mul_(1e-3)  # starts near zero, far below the rest
        model[-1].bias.zero_()
    with layerscope.watch(model, every=1) as scope:
        for step in range(12):
            with torch.no_grad():
                if step >= 5:
                    model[-1].weight.mul_(10.0)  # then runs away: 10 times a step
            model(torch.randn(32, 8)).sum().backward()
            model.zero_grad()
            scope.step()
    drift = _alerts(scope, "activation_drift")
    first = drift[drift.module == "4"].iloc[0]
    # 100 times its own start by step 7, but only a climb past 10 times the model's outputs'
    # median start (about 0.3) at step 9 says drift.
    assert first.step == 9
    assert 10 < first.value < 100
    assert "it started near zero, so its growth counts from 0.2" in first.message
    assert "compounds" in first.message


def test_a_bias_that_stays_near_zero_is_not_stepped_too_far():
    # Balanced classes keep the head's bias near zero, where each of Adam's steps, about its
    # rate, is a fifth of the bias or more: no measure of the rate for a vector.
    scope = _head_from_zero(41, every=1, kinds=("activation", "weight", "update"))
    updates = scope.frame()
    bias = updates[(updates.module == "4") & (updates.tensor == "bias")]
    ratio = (
        bias[bias.kind == "update"].set_index("step").l2
        / bias[bias.kind == "weight"].set_index("step").l2
    )
    assert (ratio[ratio.index >= 20] > 0.1).any()
    assert _alerts(scope).empty
