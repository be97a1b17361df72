"""``wrong_loss``: probabilities fed to a loss that expects logits, from hand-made scalars."""

from __future__ import annotations

from layerscope.health import RULES, WRONG_LOSS_SCALAR, HealthMonitor, parse_alerts
from layerscope.health._order import ModuleOrder
from layerscope.health._wrong_loss import WrongLoss
from layerscope.model import ModuleInfo

_TYPES = {"": "Net", "head": "Linear", "probs": "Softmax", "squash": "Sigmoid"}
_MODULES = [ModuleInfo(name, kind, {}, 0, 0, (), True) for name, kind in _TYPES.items()]


def _rule() -> WrongLoss:
    return WrongLoss(ModuleOrder(_MODULES))


def test_each_module_is_named_once_with_what_went_into_which_loss():
    rule = _rule()
    name = f"{WRONG_LOSS_SCALAR}/"
    scalars = [
        (0, "loss", 2.2),
        (0, name + "probs", 1.0),
        (0, name + "squash", 2.0),
        (3, name + "probs", 1.0),  # told again: one alert per module
        (3, name + "", 4.0),
        (3, name + "head", 9.0),  # no such code
    ]
    alerts = rule.observe_scalars(scalars)
    said = [(a.step, a.module, a.severity, a.value) for a in alerts]
    assert said == [(0, "probs", "warning", 1.0), (0, "squash", "warning", 2.0),
                    (3, "", "warning", 4.0)]  # fmt: skip
    softmax, sigmoid, model = (alert.message for alert in alerts)
    assert softmax.startswith("probs (Softmax)'s output is a softmax")
    assert "log_softmax (cross_entropy's first step) applies a softmax to it again" in softmax
    assert "step 0" in softmax
    assert "nll_loss(torch.log(p))" in softmax
    assert "binary_cross_entropy_with_logits applies a sigmoid to it again" in sigmoid
    assert "binary_cross_entropy (nn.BCELoss)" in sigmoid
    assert "Feed the logits to the loss" in sigmoid
    # A softmax given to a sigmoid's loss: no "again", and no loss that keeps a softmax.
    assert model.startswith("the model's output, made outside its watched modules")
    assert "again" not in model
    assert "BCELoss" not in model
    assert rule.observe_scalars([(4, "loss", 1.0), (4, "eval_mode/probs", 1.0)]) == []


def test_the_monitor_runs_it_by_default_and_alerts_turn_it_off():
    assert "wrong_loss" in RULES
    scalars = [(0, f"{WRONG_LOSS_SCALAR}/squash", 2.0)]
    monitor = HealthMonitor(parse_alerts(True), _MODULES)
    assert [(a.rule, a.module) for a in monitor.observe([], scalars)] == [("wrong_loss", "squash")]
    off = HealthMonitor(parse_alerts({"wrong_loss": False}), _MODULES)
    assert off.observe([], scalars) == []
