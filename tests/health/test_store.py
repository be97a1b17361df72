"""Alerts reach the run's ``alerts`` table, the log, and every sink; rules cost the writer."""

from __future__ import annotations

import logging

import torch
from pathologies import BlowUp, train
from torch import nn

import layerscope


def test_alerts_are_written_to_the_run_and_read_back_with_every_column(tmp_path, caplog):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), BlowUp(at=3), nn.Linear(16, 1))
    memory = layerscope.sinks.MemorySink()
    with caplog.at_level(logging.WARNING, logger="layerscope"):
        scope = train(model, 6, run=tmp_path / "run", sinks=[memory])
    alerts = layerscope.load(tmp_path / "run").alerts
    assert list(alerts.columns) == [
        "step", "phase", "rule", "module", "kind", "tensor", "severity", "value",
        "threshold", "message", "rank",
    ]  # fmt: skip
    [row] = alerts.itertuples()
    assert (row.step, row.rule, row.module, row.kind, row.tensor) == (
        3,
        "nonfinite",
        "2",
        "activation",
        "out",
    )
    assert row.value == 16 * 32  # every value of the batch's output is Inf
    assert row.rank == 0
    assert scope.frame("alerts").message.tolist() == [row.message]
    assert [a.message for a in memory.alerts] == [row.message]
    [logged] = [r for r in caplog.records if r.name == "layerscope"]
    assert logged.levelno == logging.ERROR
    assert row.message in logged.getMessage()
    sql = layerscope.load(tmp_path / "run").sql(
        "select module from alerts where severity = 'error'"
    )
    assert sql.module.tolist() == ["2"]


def test_each_episode_gives_one_alert_not_one_a_step():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    with layerscope.watch(model, every=1) as scope:
        for step in range(12):
            with torch.no_grad():
                # dead for steps 0-4, alive for 5-7, dead again from 8
                model[0].bias.fill_(-100.0 if step < 5 or step >= 8 else 100.0)
            model(torch.randn(8, 4)).sum().backward()
            scope.step()
    dead = scope.frame("alerts").query("rule == 'dead'")
    assert dead.step.tolist() == [2, 10]  # three steps in a row each time
