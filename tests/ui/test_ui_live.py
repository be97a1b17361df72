"""A run being written: the next request shows the new steps and alerts."""

from __future__ import annotations

import pytest
from live_training import LiveTraining
from ui_runs import Server

from layerscope.ui._encode import unpack


@pytest.fixture
def live_root(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    return root


def test_a_run_being_written_grows_between_requests(live_root):
    with Server(live_root) as server, LiveTraining(live_root / "live") as training:
        assert [run["id"] for run in server.json("/api/runs")["runs"]] == ["live"]
        first = server.json("/api/runs/live/heatmap?kind=activation")
        assert first["steps"] == [0, 1]
        assert server.json("/api/runs/live")["status"] == "running"
        assert server.json("/api/runs/live/alerts")["alerts"] == []
        training.next_round()  # steps 2 and 3, a NaN at step 3
        second = server.json("/api/runs/live/heatmap?kind=activation")
        assert second["steps"] == [0, 1, 2, 3]
        assert unpack(second["values"]).shape == (3, 4)
        assert len(server.json("/api/runs/live/scalars")["scalars"]["loss"]["steps"]) == 4
        assert server.json("/api/runs/live/series?module=0")["steps"] == [0, 1, 2, 3]
        alerts = server.json("/api/runs/live/alerts")["alerts"]
        assert [(alert["step"], alert["rule"]) for alert in alerts] == [(3, "nonfinite")]
        assert server.json("/api/runs")["runs"][0]["alerts"] == 1
    assert server_status_after_close(live_root) == "finished"


def server_status_after_close(root):
    with Server(root) as server:
        return server.json("/api/runs/live")["status"]
