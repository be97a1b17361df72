"""``scope.plot`` draws what a scope recorded so far, with or without a run directory."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import layerscope

LAYERS = ["0", "1", "2"]


def train(scope, model, optimizer, steps):
    for _ in range(steps):
        model(torch.randn(6, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=1.0)


def watched(run=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = layerscope.watch(model, run=run, every=1, optimizer=optimizer)
    return scope, model, optimizer


def expected(frame, kind, tensor, stat):
    rows = frame[(frame["kind"] == kind) & (frame["tensor"] == tensor) & (frame["call"] == 0)]
    rows = rows[~rows["sentinel"].fillna(False).astype(bool)].sort_values("step")
    return {name: group[stat].to_numpy(np.float64) for name, group in rows.groupby("module")}


@pytest.mark.parametrize("stored", [False, True], ids=["memory", "run"])
def test_scope_plot_draws_the_scopes_own_statistics(tmp_path, stored):
    scope, model, optimizer = watched(tmp_path / "run" if stored else None)
    with scope:
        train(scope, model, optimizer, 3)
        fig = scope.plot.stats(stats=("std",))
        lines = [line for line in fig.axes[0].lines if not line.get_label().startswith("_")]
        assert [line.get_label() for line in lines] == LAYERS
        reference = expected(scope.frame(), "activation", "out", "std")
        for line in lines:
            np.testing.assert_array_equal(line.get_xdata(), [0, 1, 2])
            np.testing.assert_allclose(line.get_ydata(), reference[line.get_label()], rtol=1e-12)
        train(scope, model, optimizer, 2)  # a later access shows the later steps
        grown = scope.plot.heatmap(stat="absmax", kind="grad").axes[0].images[0].get_array()
        assert grown.shape == (3, 5)
        reference = expected(scope.frame(), "grad", "out", "absmax")
        np.testing.assert_allclose(grown, np.stack([reference[name] for name in LAYERS]))
    # Histograms come through the in-memory tables trimmed, as the store writes them.
    image = scope.plot.color_dim(modules=["1"]).axes[0].images[0].get_array()
    assert image.shape[1] == 5
    frame = scope.frame()
    relu = frame[(frame["module"] == "1") & (frame["kind"] == "activation")].sort_values("step")
    counts = np.stack([np.asarray(h, dtype=np.float64) for h in relu["hist"]])
    magnitudes = counts[:, 1:-1]  # slot 0 holds the zeros, the last one the infinities
    assert np.asarray(image).sum() == pytest.approx(np.log1p(magnitudes).sum())


def test_scope_plot_of_a_run_that_wrote_nothing_yet_says_so(tmp_path):
    scope, _, _ = watched(tmp_path / "run")
    with scope, pytest.raises(ValueError, match="no 'activation' rows"):
        scope.plot.stats()


def test_scope_plot_scalars_and_alerts_from_memory():
    scope, model, optimizer = watched()
    with scope, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(scope, model, optimizer, 4)
        (axes,) = scope.plot.scalars("loss").axes
        np.testing.assert_array_equal(axes.lines[0].get_ydata(), [1.0] * 4)


def test_sentinel_rows_in_memory_are_left_out_of_figures():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    schedule = layerscope.Schedule(every=3, sentinel=True)
    with layerscope.watch(model, every=schedule) as scope:
        for _ in range(7):
            model(torch.randn(4, 3)).sum().backward()
            scope.step()
        sentinels = scope.plot.run.sql("select count(*) as n from stats where sentinel")["n"][0]
        assert sentinels > 0  # the in-memory tables hold them, as a stored run does
        (axes,) = scope.plot.stats(stats=("absmax",)).axes
        for line in axes.get_lines():
            np.testing.assert_array_equal(line.get_xdata(), [0, 3, 6])
