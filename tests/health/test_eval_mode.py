"""``eval_mode``: training passes through BatchNorm or Dropout left in eval mode."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import layerscope
from layerscope.health import EVAL_MODE_SCALAR
from layerscope.health._eval_mode import EvalMode
from layerscope.health._order import ModuleOrder
from layerscope.model import CallEvent, ModuleInfo

Before = Callable[[nn.Sequential, int], None]


def _model() -> nn.Sequential:
    """(8, 4) -> Linear -> BatchNorm1d -> ReLU -> Dropout -> Linear -> (8, 1)."""
    return nn.Sequential(
        nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 1)
    )


def _train(before: Before, steps: int = 5, prepare: Before | None = None) -> tuple[list, object]:
    """Train ``_model`` ``steps`` steps, calling ``before`` at the start of each.

    Returns its alerts (rule, module, step, severity) and its statistics' frame.
    """
    torch.manual_seed(0)
    model = _model()
    if prepare is not None:
        prepare(model, -1)
    optimizer = torch.optim.SGD((p for p in model.parameters() if p.requires_grad), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, run=None, every=2) as scope:
        for step in range(steps):
            before(model, step)
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    alerts = scope.frame("alerts")
    said = list(zip(alerts.rule, alerts.module, alerts.step, alerts.severity, strict=True))
    return [alert for alert in said if alert[0] == "eval_mode"], scope.frame("stats")


def _validate_at(at: int, undo: bool) -> Before:
    """A validation pass at step ``at`` (eval mode, no_grad); ``model.train()`` if ``undo``."""

    def before(model: nn.Sequential, step: int) -> None:
        if step == at:
            model.eval()
            with torch.no_grad():
                model(torch.randn(8, 4))
            if undo:
                model.train()

    return before


def _nothing(model: nn.Sequential, step: int) -> None:
    pass


def test_a_batchnorm_left_in_eval_mode_is_named_from_the_first_step():
    said, stats = _train(_nothing, prepare=lambda model, _: model[1].eval())
    assert said == [("eval_mode", "1", 0, "warning")]
    assert set(stats.phase) == {"train"}


def test_eval_mode_never_undone_is_named_at_its_step_and_its_passes_stay_training():
    said, stats = _train(_validate_at(1, undo=False), steps=6)
    # The first module in the forward pass that eval mode changes, at the validation's step
    # (not recorded: every=2); the Dropout after it is in the same alert.
    assert said == [("eval_mode", "1", 1, "warning")]
    activations = stats[(stats.kind == "activation") & (stats.module == "1")]
    phases = sorted(set(zip(activations.step, activations.phase, strict=True)))
    # The validation is evaluation, of step 0 (it follows step 0's optimizer step); the
    # training passes after it, in eval mode, train.
    assert phases == [(0, "eval"), (0, "train"), (2, "train"), (4, "train")]


def test_evaluations_and_adversarial_passes_in_eval_mode_are_not_training_in_it():
    validate = _validate_at(2, undo=True)

    def before(model: nn.Sequential, step: int) -> None:
        validate(model, step)
        if step == 3:  # an adversarial input made in eval mode, before the step's own pass
            model.eval()
            inputs = torch.randn(8, 4, requires_grad=True)
            model(inputs).pow(2).mean().backward()  # zero_grad() here would read as a skip
            model.train()
        if step == 4:  # then a Dropout left in eval mode: the rule is on, and says only this
            model[3].eval()

    said, stats = _train(before, steps=6)
    assert said == [("eval_mode", "3", 4, "warning")]
    evaluated = stats[(stats.phase == "eval") & (stats.kind == "activation")]
    # Each comes after an optimizer step: the validation is step 1's evaluation, the
    # adversarial pass step 2's; neither is a training pass in eval mode.
    assert sorted(set(evaluated.step)) == [1, 2]
    assert set(stats[stats.phase == "train"].step) == {0, 2, 4}


def test_dropout_in_eval_mode_is_named_unless_it_drops_nothing():
    def dropout_in_eval(p: float) -> Before:
        def prepare(model: nn.Sequential, step: int) -> None:
            model[3].p = p
            model[3].eval()

        return prepare

    assert _train(_nothing, prepare=dropout_in_eval(0.5))[0] == [("eval_mode", "3", 0, "warning")]
    assert _train(_nothing, prepare=dropout_in_eval(0.0))[0] == []


def test_frozen_batchnorm_in_eval_mode_is_a_note():
    def freeze(model: nn.Sequential, step: int) -> None:
        model[1].eval()
        model[1].requires_grad_(False)

    said, _ = _train(_nothing, prepare=freeze)
    assert said == [("eval_mode", "1", 0, "info")]


def _rule() -> EvalMode:
    """The rule over a model whose forward order is not its modules' order."""
    types = {"": "Net", "head.bn": "BatchNorm1d", "block.drop": "Dropout",
             "block.bn": "BatchNorm2d", "stem.1": "BatchNorm2d"}  # fmt: skip
    order = ModuleOrder([ModuleInfo(n, t, {}, 0, 0, (), True) for n, t in types.items()])
    forward = ["stem.1", "block.bn", "block.drop", "head.bn", ""]
    order.learn([CallEvent(0, i, "exit", name, 0) for i, name in enumerate(forward)])
    return EvalMode(order)


def test_the_rule_names_the_first_module_in_forward_order_once_per_step():
    rule = _rule()
    name = f"{EVAL_MODE_SCALAR}/"
    scalars = [
        (7, "loss", 1.0),
        (7, name + "block.drop", 1.0),
        (7, name + "stem.1", 1.0),
        (7, name + "head.bn", 0.0),
        (9, name + "block.bn", 1.0),
    ]
    alerts = rule.observe_scalars(scalars)
    said = [(a.step, a.module, a.severity, a.value) for a in alerts]
    assert said == [(7, "stem.1", "warning", 2.0), (7, "head.bn", "info", 1.0),
                    (9, "block.bn", "warning", 1.0)]  # fmt: skip
    message = alerts[0].message
    assert "block.drop" in message
    assert "step 7" in message
    assert "running statistics" in message
    assert "model.train()" in message
    assert rule.observe_scalars([(8, "loss", 1.0)]) == []
