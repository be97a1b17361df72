"""``run.plot.attention``: heads by steps of the attention table, one panel per module.

Every cell is checked against the table read with pandas (``run.attention``), and the table
against float64 by hand in tests/attention.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerscope

pytest.importorskip("matplotlib")
pytest.importorskip("duckdb")

HEADS, WIDTH, LENGTH = 3, 12, 6


class Attention(nn.Module):
    """Causal self-attention by SDPA; ``twice`` calls it a second time on its own output."""

    def __init__(self, twice: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.twice = twice

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, t, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(x)
        return x + self.attend(x) if self.twice else x


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Attention(), nn.Tanh(), Attention(twice=True))


def train(net: nn.Module, scope: layerscope.Scope, steps: int, collapse_at: int | None = None):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        if step == collapse_at:  # head 1 of module "0": its queries 50 times larger
            with torch.no_grad():
                net[0].qkv.weight[4:8].mul_(50.0)
        net(torch.randn(4, LENGTH, WIDTH, generator=generator)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """5 steps, every other recorded (0, 2, 4), the collapse planted before step 2."""
    path = tmp_path_factory.mktemp("attention") / "run"
    net = model()
    with layerscope.watch(net, run=path, every=2, attention=True, alerts=False) as scope:
        train(net, scope, 5, collapse_at=2)
    return layerscope.load(path)


def pivot(frame, module, value):
    """(call, head) rows by steps of ``value``, from the table alone."""
    rows = frame[(frame["module"] == module) & (frame["phase"] == "train")]
    return rows.pivot_table(index=["call", "head"], columns="step", values=value)


@pytest.mark.parametrize("value", ["entropy_frac", "entropy_mean", "entropy_min", "max_prob"])
def test_each_panel_is_its_modules_heads_by_recorded_steps(run, value):
    fig = run.plot.attention(value=value)
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["0 (Attention)", "2 (Attention)"]
    for ax, module in zip(panels, ["0", "2"], strict=True):
        expected = pivot(run.attention, module, value)
        assert list(expected.columns) == [0, 2, 4]
        (image,) = ax.images
        np.testing.assert_array_equal(np.ma.getdata(image.get_array()), expected.to_numpy())
        assert ax.get_xlabel() == "step"
        shown = [tick.get_text() for tick in ax.get_xticklabels() if tick.get_text()]
        assert shown
        assert set(shown) <= {"0", "2", "4"}
    # Module "2" attends twice a pass: its rows are call:head.
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["0", "1", "2"]
    assert panels[0].get_ylabel() == "head"
    labels = [t.get_text() for t in panels[1].get_yticklabels()]
    assert labels == ["0:0", "0:1", "0:2", "1:0", "1:1", "1:2"]
    assert panels[1].get_ylabel() == "call:head"
    assert "(train)" in fig.get_suptitle()


def test_fractions_are_coloured_from_0_to_1_with_a_collapse_in_red(run):
    fig = run.plot.attention("0")
    (image,) = fig.axes[0].images
    assert (image.norm.vmin, image.norm.vmax) == (0.0, 1.0)
    values = pivot(run.attention, "0", "entropy_frac").to_numpy()
    # The planted head falls near one key from step 2 on; the others stay spread.
    assert values[1, 1:].max() < 0.2
    assert values[[0, 2], :].min() > 0.5
    red, _, blue, _ = image.to_rgba(np.float64(values[1, 2]))
    assert red > 0.6
    assert blue < 0.3
    red, _, blue, _ = image.to_rgba(np.float64(values[0, 2]))
    assert blue > red
    colourbar = fig.axes[-1]
    assert colourbar.get_ylabel() == "entropy fraction"


def test_a_probability_collapses_at_1_so_its_scale_is_reversed(run):
    (image,) = run.plot.attention("0", value="max_prob").axes[0].images
    red, _, blue, _ = image.to_rgba(1.0)
    assert red > blue


def test_entropies_in_nats_run_to_the_log_of_the_keys(run):
    (image,) = run.plot.attention("0", value="entropy_mean").axes[0].images
    assert image.norm.vmax == pytest.approx(np.log(LENGTH))


@pytest.mark.parametrize(
    ("module", "drawn"), [("2", ["2"]), (["2", "0"], ["0", "2"]), (r"^\d$", ["0", "2"])]
)
def test_modules_by_name_list_or_regex(run, module, drawn):
    fig = run.plot.attention(module)
    assert [ax.get_title().split()[0] for ax in fig.axes if ax.images] == drawn


def test_bad_arguments_name_what_was_expected(run):
    with pytest.raises(ValueError, match=r"module: \['1'\] made no attention calls"):
        run.plot.attention(["1"])
    with pytest.raises(ValueError, match="matches none of the attention modules"):
        run.plot.attention("nothing")
    with pytest.raises(ValueError, match="value: expected one of"):
        run.plot.attention(value="entropy")
    with pytest.raises(ValueError, match="no attention rows in phase 'eval'"):
        run.plot.attention(phase="eval")


def test_a_run_without_attention_says_how_to_record_it(tmp_path):
    net = model()
    with layerscope.watch(net, run=tmp_path / "run", every=1) as scope:
        train(net, scope, 1)
    with pytest.raises(ValueError, match=r"recorded no attention: watch\(model, attention=True\)"):
        layerscope.load(tmp_path / "run").plot.attention()


def test_a_scope_in_memory_draws_the_same_cells():
    net = model()
    with layerscope.watch(net, every=1, attention=True, alerts=False) as scope:
        train(net, scope, 2)
        fig = scope.plot.attention(value="max_prob")
        frame = scope.frame("attention")
    for ax, module in zip(fig.axes[:2], ["0", "2"], strict=True):
        expected = pivot(frame, module, "max_prob")
        assert list(expected.columns) == [0, 1]
        np.testing.assert_array_equal(np.ma.getdata(ax.images[0].get_array()), expected)
