"""Names of 100 KB: drawn short (their two ends kept), whole in the run's rows.

matplotlib lays out every character of a label; a module name of 100 KB made one figure take
minutes. The labels checked here are the ticks, titles and legends the figures draw.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn

import layerscope
from layerscope.plots._labels import LABEL_ENDS, drawn_name

LONG = "m" * 100_000
# Two long names alike but for their ends, and one whose end is a broken formula: drawn as
# written, never parsed by mathtext.
MODULES = (LONG + "first", LONG + "relu", LONG + "last$\\frac{$")
SCALAR = LONG + "loss"
SHORT = 2 * LABEL_ENDS + 1


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> layerscope.Run:
    torch.manual_seed(0)
    model = nn.Sequential()
    for name, layer in zip(MODULES, (nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), strict=True):
        model.add_module(name, layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path_factory.mktemp("long") / "run"
    with (
        warnings.catch_warnings(),
        layerscope.watch(model, run=path, every=1, optimizer=optimizer, alerts=False) as scope,
    ):
        for _ in range(2):
            loss = model(torch.randn(6, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(**{SCALAR: loss})
    return layerscope.load(path)


def drawn(fig) -> None:
    fig.savefig(io.BytesIO(), format="png", dpi=20)  # lays out and draws every text


def test_drawn_name_keeps_both_ends_and_short_names_whole():
    assert drawn_name("blocks.11.attn.q_proj") == "blocks.11.attn.q_proj"
    exactly = "x" * SHORT
    assert drawn_name(exactly) == exactly
    first, last = drawn_name(LONG + "first"), drawn_name(LONG + "last")
    assert first != last
    assert len(first) == len(last) == SHORT
    assert first.endswith("first")
    assert last.endswith("last")
    assert drawn_name("a\nb") == "a\\x0ab"


def test_heatmap_rows_are_labelled_short_and_apart_the_rows_keep_whole_names(long_run):
    fig = long_run.plot.heatmap("absmax", "activation")
    labels = [tick.get_text() for tick in fig.axes[0].get_yticklabels()]
    assert [len(text.replace("\\$", "$")) for text in labels] == [SHORT] * 3
    assert labels[0].endswith("first")
    assert labels[1].endswith("relu")
    assert labels[2].endswith("last\\$\\frac{\\$")  # "$" escaped: no formula
    drawn(fig)  # in a second, and mathtext never sees the broken formula
    assert set(long_run.stats["module"]) == set(MODULES)
    assert set(long_run.scalars["name"]) == {SCALAR}


def test_lines_titles_and_legends_are_short(long_run):
    for fig in (
        long_run.plot.stats("activation"),
        long_run.plot.color_dim("activation"),
        long_run.plot.scalars(),
        long_run.plot.histogram(MODULES[0], "activation"),
    ):
        texts = [ax.get_title() for ax in fig.axes] + [ax.get_ylabel() for ax in fig.axes]
        for ax in fig.axes:
            legend = ax.get_legend()
            texts += [text.get_text() for text in legend.get_texts()] if legend else []
        assert texts
        assert max(map(len, texts)) < SHORT + 40, max(texts, key=len)[:200]  # and a kind
