"""``watch(alerts=...)``: which health rules run, with which options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from layerscope._limits import RULE_OPTION_BOUNDS, WHOLE_RULE_OPTIONS, check_within
from layerscope.health._accumulating_grad import AccumulatingGrad
from layerscope.health._attention_collapse import AttentionCollapse
from layerscope.health._constant_input import ConstantInput
from layerscope.health._dead import Dead
from layerscope.health._drift import ActivationDrift
from layerscope.health._eval_mode import EvalMode
from layerscope.health._gradients import Gradients
from layerscope.health._loss_collapse import LossCollapse
from layerscope.health._loss_spike import LossSpike
from layerscope.health._nonfinite import NonFinite
from layerscope.health._not_learning import NotLearning
from layerscope.health._scaler_skips import ScalerSkips
from layerscope.health._update_ratio import UpdateRatio
from layerscope.health._wrong_loss import WrongLoss

# Each rule's name, and the class that evaluates it (two rules share Gradients).
RULES: dict[str, type] = {
    "nonfinite": NonFinite,
    "dead": Dead,
    "vanishing_grad": Gradients,
    "exploding_grad": Gradients,
    "update_ratio": UpdateRatio,
    "activation_drift": ActivationDrift,
    "loss_spike": LossSpike,
    "loss_collapse": LossCollapse,
    "not_learning": NotLearning,
    "scaler_skips": ScalerSkips,
    "attention_collapse": AttentionCollapse,
    "accumulating_grad": AccumulatingGrad,
    "constant_input": ConstantInput,
    "eval_mode": EvalMode,
    "wrong_loss": WrongLoss,
}


@dataclass(frozen=True)
class AlertsConfig:
    """The rules on, each with its options, and whether a non-finite value stops training."""

    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    raise_on_nonfinite: bool = False

    def to_dict(self) -> dict[str, Any]:
        """For run.json."""
        return {"rules": self.rules, "raise": self.raise_on_nonfinite}


def parse_alerts(alerts: object) -> AlertsConfig:
    """Check ``watch(alerts=...)``: True, False, ``"raise"``, or ``{rule: False | options}``.

    Examples:
        >>> parse_alerts({"dead": {"threshold": 0.9}, "loss_spike": False}).rules["dead"]
        {'threshold': 0.9, 'units': 0.5, 'steps': 3, 'clear_below': 0.9}
    """
    if alerts is True or alerts == "raise":
        return AlertsConfig(_all_rules({}), raise_on_nonfinite=alerts == "raise")
    if alerts is False or alerts is None:
        return AlertsConfig()
    if isinstance(alerts, str):
        raise ValueError(f"alerts: expected True, False, 'raise' or a dict, got {alerts!r}")
    if not isinstance(alerts, Mapping):
        raise TypeError(
            f"alerts: expected True, False, 'raise' or a dict of rule options, got {alerts!r}"
        )
    chosen: dict[str, Any] = dict(alerts)
    raising = chosen.pop("raise", False)
    if not isinstance(raising, bool):
        raise TypeError(f"alerts['raise']: expected True or False, got {raising!r}")
    unknown = sorted(set(chosen) - set(RULES))
    if unknown:
        raise ValueError(f"alerts: unknown rule {unknown[0]!r}; the rules are {sorted(RULES)}")
    return AlertsConfig(_all_rules(chosen), raise_on_nonfinite=raising)


def _all_rules(chosen: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    rules = {}
    for name, rule in RULES.items():
        given = chosen.get(name, True)
        if given is False:
            continue
        if given is True:
            given = {}
        if not isinstance(given, Mapping):
            raise TypeError(f"alerts[{name!r}]: expected True, False or a dict, got {given!r}")
        defaults: dict[str, Any] = dict(rule.defaults)  # type: ignore[attr-defined]
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ValueError(
                f"alerts[{name!r}]: unknown option {unknown[0]!r}; its options are "
                f"{sorted(defaults)}"
            )
        for option, value in given.items():
            _check_option(name, option, value, defaults[option])
        rules[name] = {**defaults, **given}
    return rules


def _check_option(rule: str, option: str, value: object, default: object) -> None:
    """A TypeError or ValueError naming ``alerts[rule][option]`` unless ``value`` fits it."""
    where = f"alerts[{rule!r}][{option!r}]"
    numeric = isinstance(default, int | float)
    if isinstance(value, bool) or not (
        isinstance(value, int | float) if numeric else isinstance(value, type(default))
    ):
        raise TypeError(f"{where}: expected {type(default).__name__}, got {value!r}")
    if not numeric:
        return
    assert isinstance(value, int | float)
    bound = RULE_OPTION_BOUNDS[rule][option]
    check_within(value, where, bound)
    if option in WHOLE_RULE_OPTIONS and not float(value).is_integer():
        raise ValueError(f"{where}: expected a whole number of steps, got {value!r}")
