"""Healthy runs that looked sick: a GradScaler's scaled gradients, a convolution's bias before
BatchNorm, a loop that never steps. None may raise an alert; the pathology each rule is for
must still be found under the same conditions."""

from __future__ import annotations

import pytest
import torch
from pathologies import mlp
from torch import nn

import layerscope

EVERY_KIND = ("activation", "grad", "weight", "weight_grad", "input", "update", "buffer")


def _warnings(scope: layerscope.Scope, rule: str | None = None):
    alerts = scope.frame("alerts")
    alerts = alerts[alerts.severity != "info"]
    return alerts if rule is None else alerts[alerts.rule == rule]


def _train_scaled(
    model: nn.Module,
    steps: int,
    *,
    dtype: torch.dtype | None = None,
    init_scale: float = 2.0**16,
    loss_factor: float = 1.0,
    lr: float = 0.01,
    **watch: object,
) -> layerscope.Scope:
    """Train under a GradScaler at ``init_scale`` (its default) and, with ``dtype``, autocast."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    inputs = next(model.parameters()).shape[1]
    watch.setdefault("every", 1)
    with layerscope.watch(model, optimizer=optimizer, **watch) as scope:  # type: ignore[arg-type]
        for _ in range(steps):
            x = torch.randn(32, inputs, generator=generator)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = model(x)
            loss = (out.float() - x[:, :1]).pow(2).mean() * loss_factor
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return scope


# ------------------------------------------------------------------ GradScaler


@pytest.mark.parametrize(
    "dtype", [None, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_a_healthy_model_under_a_grad_scaler_raises_no_gradient_alert(dtype):
    model = mlp([8, 32, 32, 32, 1], activation=nn.GELU)
    scope = _train_scaled(model, 12, dtype=dtype)
    frame = scope.frame()
    grads = frame[frame.kind == "grad"]
    # Read during backward, the output gradients are in the scaler's units: far above the
    # absolute bound, as the scale (65,536) makes them.
    assert (grads.l2 / grads.numel**0.5 > 1e3).any()
    assert _warnings(scope).empty, _warnings(scope).message.tolist()


def test_steps_a_grad_scaler_skipped_raise_no_gradient_alert():
    # 2**24 overflows fp16 gradients: GradScaler skips steps and halves its scale until they
    # fit. A skipped step's gradients are scaled and hold Inf: the nonfinite rule's, if any.
    model = mlp([8, 32, 32, 1], activation=nn.GELU)
    scope = _train_scaled(model, 12, dtype=torch.float16, init_scale=2.0**24)
    skipped = set(scope.frame("scalars").query("name == 'skipped'").step)
    assert {0, 1} <= skipped  # two in a row: as many as the rules wait for
    assert _warnings(scope, "exploding_grad").empty
    assert _warnings(scope, "vanishing_grad").empty


def test_parameter_gradients_under_fp16_autocast_are_recorded_unscaled():
    # Under fp16 they are read at backward too (a step GradScaler skips has no other moment),
    # then unscaled in place by an op that leaves their version: the optimizer's reading
    # must be taken anew, not the scaled one reused.
    model = mlp([8, 32, 1], activation=nn.GELU)
    seen = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    optimizer.register_step_pre_hook(lambda *_: seen.append(model[0].weight.grad.norm().item()))
    scaler = torch.amp.GradScaler("cpu")
    with layerscope.watch(model, optimizer=optimizer, every=1, kinds=("weight_grad",)) as scope:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(16, 8)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    rows = scope.frame().query("module == '0' and tensor == 'weight'")
    assert rows.l2.tolist() == pytest.approx(seen, rel=1e-6)


def test_exploding_parameter_gradients_are_found_under_a_grad_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32, bias=False) for _ in range(12)])
    with torch.no_grad():
        for layer in model:
            nn.init.normal_(layer.weight, std=0.6)  # gain about 3.4 a layer
    scope = _train_scaled(model, 3, lr=0.0)  # as it starts: the weights stay finite
    exploding = _warnings(scope, "exploding_grad")
    assert "0" in set(exploding.module)


def test_output_gradients_are_judged_against_the_layers_after_them_only():
    # A loss scaled by hand (or a sum where a mean was meant) scales every gradient alike.
    # The optimizer sees the parameter gradients so: too large. The output gradients' units
    # are the loss's: nothing to say about them until one layer differs from those after it.
    # Trained at a rate of 0: its updates would make every gradient really explode at once.
    model = mlp([8, 32, 32, 1], activation=nn.GELU)
    scope = _train_scaled(model, 4, init_scale=1.0, loss_factor=1e7, lr=0.0)
    exploding = _warnings(scope, "exploding_grad")
    assert len(exploding)
    assert set(exploding.kind) == {"weight_grad"}


# ------------------------------------------------------------------ BatchNorm after a bias


def _conv_bn(zero_bias: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    if zero_bias:  # as torchvision's VGG with BatchNorm initialises its convolutions
        for layer in (model[0], model[3]):
            nn.init.zeros_(layer.bias)
    return model


def _train_classifier(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, steps: int, **watch: object
) -> layerscope.Scope:
    generator = torch.Generator().manual_seed(0)
    watch.setdefault("every", 1)
    with layerscope.watch(model, optimizer=optimizer, **watch) as scope:  # type: ignore[arg-type]
        for _ in range(steps):
            x = torch.randn(16, 3, 8, 8, generator=generator)
            y = torch.randint(0, 10, (16,), generator=generator)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            scope.step(loss=loss)
    return scope


_OPTIMIZERS = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
}


@pytest.mark.parametrize("zero_bias", [False, True], ids=["default-bias", "zero-bias"])
@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
def test_the_bias_of_a_convolution_before_batch_norm_raises_no_alert(optimizer, zero_bias):
    model = _conv_bn(zero_bias)
    scope = _train_classifier(
        model, _OPTIMIZERS[optimizer](model.parameters()), 30, kinds=EVERY_KIND
    )
    frame = scope.frame()
    bias_grads = frame.query("kind == 'weight_grad' and module == '0' and tensor == 'bias'")
    weight_grads = frame.query("kind == 'weight_grad' and module == '0' and tensor == 'weight'")
    # BatchNorm subtracts the batch mean: the bias's gradient is zero up to rounding.
    assert (bias_grads.l2.to_numpy() < 1e-4 * weight_grads.l2.to_numpy()).all()
    assert _warnings(scope).empty, _warnings(scope).message.tolist()


def test_a_convolution_left_out_of_the_optimizer_is_found_but_not_its_bias_before_batch_norm():
    model = _conv_bn()
    kept = [p for name, p in model.named_parameters() if not name.startswith("3.")]
    optimizer = torch.optim.SGD(kept, lr=0.01, momentum=0.9)
    scope = _train_classifier(model, optimizer, 6)
    ratio = _warnings(scope, "update_ratio")
    # The bias's gradient is zero up to rounding: no step would change it, optimizer or not.
    assert set(zip(ratio.module, ratio.tensor, strict=True)) == {("3", "weight")}


# ------------------------------------------------------------------ no optimizer step


def _inspect(model: nn.Module, steps: int, **watch: object) -> layerscope.Scope:
    """Backward passes with no update: gradients looked at, never applied."""
    generator = torch.Generator().manual_seed(0)
    with layerscope.watch(model, every=1, **watch) as scope:  # type: ignore[arg-type]
        for _ in range(steps):
            x = torch.randn(32, 8, generator=generator)
            (model(x) - x[:, :1]).pow(2).mean().backward()
            scope.step()  # the step's gradients are read before zero_grad() clears them
            model.zero_grad()
    return scope


@pytest.mark.parametrize("given", ["none", "never-stepped", "never-stepped-missing-a-layer"])
def test_a_loop_that_never_steps_raises_no_update_ratio_alert(given):
    model = mlp([8, 32, 32, 32, 1])
    watch: dict[str, object] = {}
    if given != "none":
        params = list(model.parameters())
        if given == "never-stepped-missing-a-layer":
            params = [p for name, p in model.named_parameters() if not name.startswith("2.")]
        watch["optimizer"] = torch.optim.SGD(params, lr=0.01)
    scope = _inspect(model, 10, **watch)
    assert len(scope.frame().query("kind == 'weight_grad'"))  # gradients flowed
    assert _warnings(scope, "update_ratio").empty


def test_a_hand_written_update_that_misses_a_layer_is_found():
    model = mlp([8, 32, 32, 1])
    generator = torch.Generator().manual_seed(0)
    with layerscope.watch(model, every=1) as scope:
        for _ in range(6):
            x = torch.randn(32, 8, generator=generator)
            (model(x) - x[:, :1]).pow(2).mean().backward()
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if not name.startswith("2."):  # layer 2 forgotten
                        param -= 0.01 * param.grad
            model.zero_grad()
            scope.step()
    ratio = _warnings(scope, "update_ratio")
    assert set(zip(ratio.module, ratio.tensor, strict=True)) == {("2", "weight"), ("2", "bias")}
    assert (ratio.value == 0.0).all()


@pytest.mark.parametrize("alerts", [True, "raise"])
def test_gradients_a_grad_scaler_overflowed_are_not_a_nonfinite_fault(alerts):
    # GradScaler's routine: Inf in the scaled fp16 gradients, the step skipped, the scale
    # halved. The forward pass was finite and nothing was applied: no error, no stop.
    model = mlp([8, 32, 32, 1], activation=nn.GELU)
    scope = _train_scaled(model, 12, dtype=torch.float16, init_scale=2.0**24, alerts=alerts)
    frame = scope.frame()
    skipped = set(scope.frame("scalars").query("name == 'skipped'").step)
    assert {0, 1} <= skipped
    overflowed = frame[(frame.kind == "grad") & (frame.inf_count + frame.nan_count > 0)]
    assert set(overflowed.step) <= skipped
    assert not overflowed.empty  # the gradients really held Inf
    assert scope.frame("alerts").query("rule == 'nonfinite'").empty
    assert scope.current_step == 12  # alerts="raise" did not stop the training


def test_a_nan_in_the_forward_pass_of_a_skipped_step_is_still_a_fault():
    model = mlp([8, 32, 32, 1], activation=nn.GELU)
    with torch.no_grad():
        model[0].bias[0] = float("nan")
    scope = _train_scaled(model, 3, dtype=torch.float16, init_scale=2.0**24)
    found = scope.frame("alerts").query("rule == 'nonfinite'")
    assert found.kind.tolist() == ["activation"]
