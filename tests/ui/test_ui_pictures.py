"""Answers behind pictures that are easy to get wrong: module types, linear histograms,
an all-zero tensor, the overhead of a run being written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from live_training import LiveTraining
from test_ui_api import train_rows
from torch import nn
from ui_runs import LINEAR_HISTOGRAM, Server, _alert, record, write_alerts

import layerscope
from layerscope.ui._encode import unpack


def test_heat_map_names_the_module_type_of_each_layer(pictures, pictures_root):
    types = {info.name: info.type for info in layerscope.load(pictures_root / "tanh").modules}
    answer = pictures.json("/api/runs/tanh/heatmap?kind=activation&stat=absmax")
    assert answer["layers"] == ["0", "1", "2"]
    assert answer["types"] == [types[name] for name in answer["layers"]]
    assert answer["types"] == ["Linear", "Tanh", "Linear"]
    assert pictures.json("/api/runs/dead/heatmap?kind=activation")["types"][1] == "ReLU"


def test_a_fraction_says_so_and_a_magnitude_does_not(pictures):
    for stat, fraction in [("neg_frac", True), ("zero_frac", True), ("std", False)]:
        answer = pictures.json(f"/api/runs/tanh/heatmap?kind=activation&stat={stat}")
        assert answer["fraction"] is fraction


def linear_bounds():
    """Where the figures draw a linear histogram's slots: the bins from lo to hi, and a band a
    tenth of the range wide beyond each end for the underflow and overflow slots."""
    _, lo, hi, bins = LINEAR_HISTOGRAM
    band = (hi - lo) / 10
    return [lo - band, *np.linspace(lo, hi, bins + 1).tolist(), hi + band]


def test_a_linear_histogram_is_answered_in_value_units(pictures, pictures_root):
    run = layerscope.load(pictures_root / "linear")
    rows = train_rows(run, "activation", "out")
    rows = rows[rows["module"] == "1"].sort_values("step")
    expected = np.stack([np.asarray(hist, dtype=np.float64) for hist in rows["hist"]], axis=1)
    assert expected.shape == (LINEAR_HISTOGRAM[3] + 2, 3)  # underflow, 8 bins, overflow

    colour = pictures.json("/api/runs/linear/colordim?kind=activation&module=1")
    assert colour["scale"] == "linear"
    np.testing.assert_allclose(colour["bounds"], linear_bounds())
    assert colour["open_slots"] == ["< -1", "≥ 1"]
    np.testing.assert_array_equal(unpack(colour["counts"]), expected)  # every slot, in order
    assert "zeros" not in colour  # a zero is a value among the others, not a slot apart
    assert "exponents" not in colour

    step = int(rows["step"].iloc[1])
    shown = pictures.json(f"/api/runs/linear/distribution?kind=activation&module=1&step={step}")
    assert shown["scale"] == "linear"
    np.testing.assert_allclose(shown["bounds"], linear_bounds())
    np.testing.assert_allclose(shown["fractions"], expected[:, 1] / expected[:, 1].sum())
    assert shown["total"] == expected[:, 1].sum() == rows["numel"].iloc[1]  # no NaN: all counted


def test_an_all_zero_tensor_is_all_in_the_zero_slot(pictures):
    shown = pictures.json("/api/runs/dead/distribution?kind=activation&module=1&step=2")
    assert shown["scale"] == "log2"
    assert shown["zeros"] == 1.0
    assert shown["total"] == 6 * 8
    assert sum(shown["fractions"]) == 0
    colour = pictures.json("/api/runs/dead/colordim?kind=activation&module=1")
    assert colour["zeros"] == [48.0] * 4


def test_the_overhead_of_a_run_being_written_says_what_is_not_known_yet(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    with Server(root) as server, LiveTraining(root / "live") as training:
        training.next_round()
        meta = json.loads((root / "live" / "run.json").read_text())
        assert meta["status"] == "running"
        assert meta["writer_seconds"] == 0.0  # what run.json holds until close
        live = server.json("/api/runs/live")["overhead"]
        assert live["live"] is True
        assert live["writer_seconds"] is None  # not yet known, rather than 0
        assert live["cost_seconds"] == pytest.approx(meta["cost_seconds"])  # noted each flush
        assert live["cost_seconds"] > 0
        assert live["kernel"] == meta["kernel"]
        assert live["steps"] == 4
    with Server(root) as server:
        closed = server.json("/api/runs/live")["overhead"]
    meta = json.loads((root / "live" / "run.json").read_text())
    assert closed["live"] is False
    assert closed["writer_seconds"] == meta["writer_seconds"] > 0


def test_the_alerts_of_a_step_come_in_model_order_not_as_text(tmp_path):
    twelve = nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)])
    path = record(tmp_path / "deep", 1, model=twelve, nan_at=0)  # an alert: its file
    write_alerts(path, [_alert(0, "dead", "warning", m, "activation") for m in ("10", "2", "1")])
    with Server(tmp_path) as server:
        listed = server.json("/api/runs/deep/alerts")["alerts"]
    assert [alert["module"] for alert in listed] == ["1", "2", "10"]
