"""Long runs: columns of several steps, aggregated in SQL, equal to the rows aggregated here."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from ui_runs import Server

import layerscope
from layerscope.ui._encode import unpack
from layerscope.ui._query import MAX_COLUMNS

BENCHMARKS = Path(__file__).parent.parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """A synthetic run of 3 layers by 2,500 recorded steps: columns of 3 steps."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from synthetic import write_run
    finally:
        sys.path.remove(str(BENCHMARKS))
    root = tmp_path_factory.mktemp("long")
    write_run(root / "long", layers=3, steps=2500, steps_per_segment=500)
    with Server(root) as server:
        yield server, layerscope.load(root / "long")


def rows_of(run, kind):
    stats = run.stats
    return stats[(stats["kind"] == kind) & (stats["phase"] == "train")].assign(
        bucket=lambda frame: frame["step"] // 3
    )


@pytest.mark.parametrize(("stat", "reduce"), [("absmax", "max"), ("l2", "mean"), ("min", "min")])
def test_heat_map_of_a_long_run(long_run, stat, reduce):
    server, run = long_run
    answer = server.json(f"/api/runs/long/heatmap?kind=grad&stat={stat}")
    assert answer["downsampled"]
    assert answer["width"] == 3  # 2,500 steps in at most 1,000 columns
    assert len(answer["steps"]) == 834 <= MAX_COLUMNS
    assert answer["steps"][:3] == [0, 3, 6]
    assert answer["last_steps"][-1] == 2499
    expected = rows_of(run, "grad").groupby(["module", "bucket"])[stat].agg(reduce).unstack()
    values = unpack(answer["values"])
    assert values.shape == (3, 834)
    for row, layer in enumerate(answer["layers"]):
        np.testing.assert_allclose(values[row], expected.loc[layer].to_numpy(), rtol=1e-6)


def test_series_and_color_dim_of_a_long_run(long_run):
    server, run = long_run
    rows = rows_of(run, "activation")
    rows = rows[rows["module"] == "layers.1"]
    series = server.json("/api/runs/long/series?kind=activation&module=layers.1")
    assert series["width"] == 3
    assert series["aggregates"]["absmax"] == "max"
    np.testing.assert_allclose(
        unpack(series["stats"]["std"]), rows.groupby("bucket")["std"].mean().to_numpy(), rtol=1e-6
    )
    colour = server.json("/api/runs/long/colordim?kind=activation&module=layers.1")
    assert colour["aggregate"] == "mean"
    assert len(colour["steps"]) == 834
    # Each column: the mean histogram of its steps, over all 256 slots.
    mean = np.stack(rows.groupby("bucket")["hist"].apply(lambda h: np.mean(np.stack(h), axis=0)))
    edges = np.asarray(run.meta["histogram_edges"])
    slots = [int(np.flatnonzero(edges == 2.0**e)[0]) for e in colour["exponents"]]
    np.testing.assert_allclose(unpack(colour["counts"]).T, mean[:, slots], rtol=1e-6)
    np.testing.assert_allclose(colour["zeros"], mean[:, 0], rtol=1e-6)
    np.testing.assert_allclose(colour["totals"], mean.sum(axis=1), rtol=1e-6)
    assert mean[:, [i for i in range(256) if i not in slots and i != 0]].sum() == 0


def test_columns_of_one_recorded_step_each_are_not_called_aggregated(tmp_path):
    """every=2 in columns of 2 steps: each column is one recorded step, its value as is."""
    import torch
    from starlette.testclient import TestClient
    from torch import nn

    from layerscope.ui._app import create_app

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=2, run=tmp_path / "r") as scope:
        for _ in range(10):
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    stats = scope.frame()
    client = TestClient(create_app(tmp_path), base_url="http://127.0.0.1")
    for route in ("heatmap", "series", "colordim"):
        params = {"stat": "std", "module": "0", "columns": 5}
        answer = client.get(f"/api/runs/r/{route}", params=params).json()
        assert answer["width"] == 2
        assert answer["steps"] == answer["last_steps"] == [0, 2, 4, 6, 8]
        assert not answer["downsampled"]
        assert answer.get("aggregate") is None
        assert answer.get("aggregates") is None
    heat = client.get("/api/runs/r/heatmap", params={"stat": "std", "columns": 5}).json()
    rows = stats[(stats.kind == "activation") & (stats.module == "0") & ~stats.sentinel]
    np.testing.assert_allclose(unpack(heat["values"])[0], rows.sort_values("step")["std"])
