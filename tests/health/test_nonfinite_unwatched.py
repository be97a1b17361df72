"""``nonfinite`` where the steps around the first NaN were not watched: the loss dates it,
weights poisoned by an unwatched update name no layer, and a NaN at a skipped step is not
GradScaler's overflow."""

from __future__ import annotations

import torch
from pathologies import BlowUp, NaNInBackward
from torch import nn

import layerscope


class _InfBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * float("inf")  # an overflow: Inf (and NaN where the gradient is 0)


class InfInBackward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _InfBackward.apply(x)


def _train(model: nn.Module, steps: int, every: object, log_loss: bool, scaler: bool = False):
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    grad_scaler = torch.amp.GradScaler("cpu") if scaler else None
    with layerscope.watch(model, optimizer=optimizer, every=every) as scope:  # type: ignore[arg-type]
        for _ in range(steps):
            x = torch.randn(16, 8, generator=generator)
            loss = (model(x) - x[:, :1]).pow(2).mean()
            if grad_scaler is not None:
                grad_scaler.scale(loss).backward()
                grad_scaler.step(optimizer)
                grad_scaler.update()
            else:
                loss.backward()
                optimizer.step()
            optimizer.zero_grad()
            scope.step(**({"loss": loss} if log_loss else {}))
    alerts = scope.frame("alerts")
    return alerts[alerts.rule == "nonfinite"]


def test_weights_poisoned_between_recorded_steps_name_no_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), BlowUp(at=13), nn.Linear(16, 1))
    schedule = layerscope.Schedule(every=10, sentinel=False)
    [alert] = _train(model, 21, schedule, log_loss=False).itertuples()
    # Step 13's NaN made every weight NaN: at step 20 layer 0's output is the first NaN in
    # forward order, whole, from its weights: it is where the NaN arrived, not where it began.
    assert (alert.step, alert.module, alert.kind) == (20, "", "weight")
    assert "between steps 11 and 20" in alert.message
    assert "poisoned the weights" in alert.message
    assert "0 (Linear)'s output" in alert.message


def test_a_loss_that_turns_non_finite_at_a_watched_step_with_finite_layers_names_the_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for step in range(6):
            loss = model(torch.randn(4, 8, generator=generator)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            # The logged loss alone is NaN from step 3 (a metric's division by zero).
            scope.step(loss=loss * (float("nan") if step >= 3 else 1.0))
    alerts = scope.frame("alerts")
    [alert] = alerts[alerts.rule == "nonfinite"].itertuples()
    assert (alert.step, alert.module, alert.tensor) == (3, "", "loss")
    assert "what was watched of this step is finite" in alert.message


def test_a_nan_gradient_at_a_skipped_step_is_a_fault_and_an_inf_an_overflow():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), NaNInBackward(at=4), nn.Tanh(), nn.Linear(16, 1))
    [alert] = _train(model, 8, 1, log_loss=True, scaler=True).itertuples()
    # GradScaler skips every step from 4: NaN and no Inf is a fault, not the scale's.
    assert (alert.step, alert.module, alert.kind) == (4, "0", "grad")
    assert "the gradients hold NaN and no Inf" in alert.message
    # An Inf among them is GradScaler's overflow, which it skips by design.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), InfInBackward(), nn.Tanh(), nn.Linear(16, 1))
    assert _train(model, 6, 1, log_loss=True, scaler=True).empty
