"""``watch(alerts=...)``: what it accepts, and the errors that name what was expected."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope
from layerscope.health import RULES, parse_alerts


def test_true_turns_every_rule_on_with_its_defaults_and_false_none():
    assert set(parse_alerts(True).rules) == set(RULES)
    assert parse_alerts(False).rules == {}
    assert parse_alerts("raise").raise_on_nonfinite
    assert not parse_alerts(True).raise_on_nonfinite


def test_a_dict_tunes_or_leaves_out_rules():
    config = parse_alerts({"dead": {"threshold": 0.5}, "loss_spike": False, "raise": True})
    assert config.rules["dead"]["threshold"] == 0.5
    assert config.rules["dead"]["steps"] == 3
    assert "loss_spike" not in config.rules
    assert config.raise_on_nonfinite


@pytest.mark.parametrize(
    ("alerts", "error", "match"),
    [
        ("yes", ValueError, r"alerts: expected True, False, 'raise' or a dict"),
        (3, TypeError, r"alerts: expected True, False, 'raise' or a dict"),
        ({"dying": {}}, ValueError, r"alerts: unknown rule 'dying'"),
        ({"dead": {"limit": 1}}, ValueError, r"alerts\['dead'\]: unknown option 'limit'"),
        ({"dead": {"threshold": "high"}}, TypeError, r"alerts\['dead'\]\['threshold'\]"),
        ({"dead": 3}, TypeError, r"alerts\['dead'\]: expected True, False or a dict"),
        ({"raise": "yes"}, TypeError, r"alerts\['raise'\]"),
    ],
)
def test_bad_options_name_the_argument(alerts, error, match):
    with pytest.raises(error, match=match):
        layerscope.watch(nn.Linear(2, 2), alerts=alerts)


def test_alerts_false_writes_no_alert(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # dead from the start
    with layerscope.watch(model, every=1, alerts=False, run=tmp_path / "r") as scope:
        for _ in range(5):
            model(torch.randn(8, 4)).sum().backward()
            scope.step()
    assert layerscope.load(tmp_path / "r").alerts.empty
    assert layerscope.load(tmp_path / "r").meta["config"]["alerts"] == {"rules": {}, "raise": False}
