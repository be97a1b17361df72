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
