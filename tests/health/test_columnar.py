"""The rules evaluated over a flush's columns give the alerts the per-row rules gave, alert for
alert: on random flushes of small models (every rule firing and clearing, options drawn), and
on the speed benchmark's flushes with their planted pathologies."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest
from flushes import Flushes, call_order, model
from rowwise.monitor import HealthMonitor as RowwiseMonitor

from layerscope.health import Alert, HealthMonitor, parse_alerts

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "health_speed.py"


def _plain(alerts: list[Alert]) -> list[tuple[object, ...]]:
    """Alerts as tuples that compare equal when they are (NaN values too)."""
    return [
        tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in vars_of(a))
        for a in alerts
    ]


def vars_of(alert: Alert) -> tuple[object, ...]:
    return (
        alert.step, alert.phase, alert.rule, alert.module, alert.kind, alert.tensor,
        alert.severity, alert.value, alert.threshold, alert.message,
    )  # fmt: skip


def _options(rng: random.Random) -> dict[str, object]:
    """Rule options drawn around their defaults, tight enough that every rule fires."""
    return {
        "dead": {"steps": rng.choice((1, 2, 3)), "clear_below": rng.choice((0.5, 0.9))},
        "vanishing_grad": {"relative": rng.choice((10.0, 100.0, 1e3)), "steps": rng.choice((1, 2))},
        "exploding_grad": {
            "exploding_above": rng.choice((1.0, 1e3)),
            "growth": rng.choice((3.0, 100.0)),
        },
        "update_ratio": {"warmup": rng.choice((0, 5, 20)), "high": rng.choice((0.1, 10.0))},
        "activation_drift": {
            "factor": rng.choice((10.0, 100.0)),
            "baseline": rng.choice((1, 2, 5)),
        },
        "loss_spike": {"warmup": rng.choice((2, 10)), "window": rng.choice((5, 20))},
    }


@pytest.mark.parametrize("seed", range(16))
def test_random_flushes_give_the_alerts_of_the_per_row_rules(seed):
    rng = random.Random(seed)
    infos = model(rng)
    config = parse_alerts(_options(rng))
    left_out = rng.choice((None, frozenset(), frozenset({(infos[1].name, "weight")})))
    matrices = rng.choice((None, frozenset((info.name, "weight") for info in infos)))
    columnar = HealthMonitor(config, infos, left_out, matrices=matrices)
    rowwise = RowwiseMonitor(config, infos, left_out, matrices=matrices)
    found: list[Alert] = []
    for number, (chunks, scalars) in zip(range(30), Flushes(seed, infos), strict=False):
        if number % 7 == 3:  # a logged call order changes the forward order
            calls = call_order(rng, infos, number)
            columnar.learn_calls(calls)
            rowwise.learn_calls(calls)
        alerts = columnar.observe(chunks, scalars)
        assert _plain(alerts) == _plain(rowwise.observe(chunks, scalars)), number
        found += alerts
    assert found  # the flushes are not all quiet


def test_random_flushes_fire_every_rule():
    rules: set[str] = set()
    for seed in range(16):
        rng = random.Random(seed)
        infos = model(rng)
        monitor = HealthMonitor(parse_alerts(_options(rng)), infos)
        for _, (chunks, scalars) in zip(range(30), Flushes(seed, infos), strict=False):
            rules |= {alert.rule for alert in monitor.observe(chunks, scalars)}
    assert rules == {
        "nonfinite", "dead", "vanishing_grad", "exploding_grad", "update_ratio",
        "activation_drift", "loss_spike", "scaler_skips", "not_learning",
    }  # fmt: skip


@pytest.mark.parametrize("small", [False, True], ids=["large", "small"])
def test_the_benchmark_flushes_give_the_alerts_of_the_per_row_rules(small, monkeypatch):
    spec = importlib.util.spec_from_file_location("health_speed", BENCHMARK)
    assert spec is not None
    assert spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    if small:
        monkeypatch.setattr(benchmark, "BLOCKS", 4)
        monkeypatch.setattr(benchmark, "STEPS_PER_FLUSH", 10)
    columnar = HealthMonitor(parse_alerts(True), benchmark.modules())
    rowwise = RowwiseMonitor(parse_alerts(True), benchmark.modules())
    found: list[Alert] = []
    for chunks, scalars in benchmark.flushes(24):
        alerts = columnar.observe(chunks, scalars)
        assert _plain(alerts) == _plain(rowwise.observe(chunks, scalars))
        found += alerts
    planted = {(alert.rule, alert.module, alert.step) for alert in found}
    if small:
        assert planted == {("loss_spike", "", 44)}
    else:
        assert planted == {
            ("activation_drift", "blocks.200.linear", 24),  # planted there
            ("dead", "blocks.40.act", 24),
            ("exploding_grad", "blocks.7.linear", 32),
            ("loss_spike", "blocks.200.linear", 44),
            ("nonfinite", "blocks.150.linear", 36),
            ("update_ratio", "blocks.100.norm", 2),
        }
