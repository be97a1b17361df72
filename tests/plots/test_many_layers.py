"""Figures of a deep model stay readable: colour by depth, a sample of panels, some row labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.plots.conftest import reference
from torch import nn

import layerscope

DEPTH = 45


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(DEPTH)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path_factory.mktemp("deep") / "run"
    with layerscope.watch(model, run=path, every=1, optimizer=optimizer) as scope:
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    return layerscope.load(path)


NAMES = [str(index) for index in range(DEPTH)]


def test_lines_of_many_layers_are_coloured_by_depth_with_a_colour_bar(deep_run):
    fig = deep_run.plot.stats(stats=("mean",))
    axes, bar = fig.axes  # the plot and its colour bar, no legend
    assert axes.get_legend() is None
    lines = axes.get_lines()
    assert [line.get_label() for line in lines] == NAMES
    expected = reference(deep_run, "activation", "out", "mean")
    for line in lines:
        np.testing.assert_allclose(line.get_ydata(), expected[line.get_label()][1], rtol=1e-12)
    first, last = (np.asarray(line.get_color()) for line in (lines[0], lines[-1]))
    assert not np.allclose(first, last)
    assert [tick.get_text() for tick in bar.get_yticklabels()] == ["0", str(DEPTH - 1)]
    assert bar.get_ylabel() == "module (model order)"


def test_color_dim_of_every_layer_shows_an_even_sample(deep_run):
    fig = deep_run.plot.color_dim()
    titles = [axes.get_title() for axes in fig.axes]
    assert len(titles) == 16
    assert titles[0] == "0 activation"
    assert titles[-1] == f"{DEPTH - 1} activation"
    shown = [int(title.split()[0]) for title in titles]
    assert shown == sorted(set(shown))  # model order, no layer twice
    assert fig.get_suptitle().startswith(f"16 of {DEPTH} layers")
    # Named layers are all drawn, however many.
    chosen = deep_run.plot.color_dim(modules=NAMES[:20])
    assert len(chosen.axes) == 20
    assert not chosen.get_suptitle()


def test_heatmap_of_many_layers_has_every_row_and_some_labels(deep_run):
    fig = deep_run.plot.heatmap(stat="absmax", kind="activation")
    (image,) = fig.axes[0].images
    assert image.get_array().shape == (DEPTH, 3)
    ticks = fig.axes[0].get_yticks()
    labels = [label.get_text() for label in fig.axes[0].get_yticklabels()]
    assert len(labels) == 40
    assert (labels[0], labels[-1]) == ("0", str(DEPTH - 1))
    assert [NAMES[int(row)] for row in ticks] == labels  # each label names its own row
    assert fig.get_size_inches()[1] <= 14.0
