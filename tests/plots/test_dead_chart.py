"""The dead chart: exact zeros, or values near zero read off the log2 histograms, all visible.

miniai's target is a layer whose outputs collapse towards zero without reaching it: here
Linear layers whose parameters shrink tenfold a step. Its fraction of exact zeros stays 0; the
fraction below a threshold is compared with the outputs themselves, kept by a hook.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba
from tests.plots.conftest import LAYERS, assert_lines_match, layer_lines, reference
from torch import nn

import layerscope

STEPS = 6
# 1e-3 lies between 2**-10 and 2**-9: rounded down, the chart counts |x| < 2**-10.
THRESHOLD = 1e-3
EDGE = 2.0**-10


@pytest.fixture(scope="module")
def collapsing(tmp_path_factory):
    """A run whose outputs shrink tenfold a step, and those outputs (step -> module)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    outputs: dict[int, dict[str, np.ndarray]] = {}
    step = 0

    def keep(name):
        def hook(module, inputs, output):
            outputs.setdefault(step, {})[name] = output.detach().numpy().copy()

        return hook

    for name, module in model.named_children():
        module.register_forward_hook(keep(name))
    path = tmp_path_factory.mktemp("dead") / "run"
    with layerscope.watch(model, run=path, every=1) as scope:
        shrink(model, 1e-2)  # outputs of about 1e-2 at step 0: some below 1e-3
        for step in range(STEPS):  # noqa: B007  # the hooks read it
            model(torch.randn(16, 8))
            scope.step()
            shrink(model, 0.1)
    return layerscope.load(path), outputs


@torch.no_grad()
def shrink(model, factor):
    for parameter in model.parameters():
        parameter.mul_(factor)


def below(outputs, bound):
    """module -> (steps, fraction of |output| < bound), from the outputs themselves."""
    return {
        name: (
            np.arange(STEPS),
            np.array([np.mean(np.abs(outputs[step][name]) < bound) for step in range(STEPS)]),
        )
        for name in LAYERS
    }


def test_zero_fraction_misses_a_collapse_that_the_threshold_shows(collapsing):
    run, outputs = collapsing
    (axes,) = run.plot.dead_chart().axes
    assert_lines_match(axes, reference(run, "activation", "out", "zero_frac"), LAYERS)
    assert not layer_lines(axes)[0].get_ydata().any()  # no exact zero in the Linear's output

    (axes,) = run.plot.dead_chart(threshold=THRESHOLD).axes
    expected = below(outputs, EDGE)
    assert_lines_match(axes, expected, LAYERS)
    collapse = expected["0"][1]
    assert 0 < collapse[0] < 1  # the threshold cuts through the first step's outputs
    assert collapse[-1] == 1  # and all of them are below it at the end
    assert axes.get_ylabel() == f"fraction |value| < {EDGE:.3g}"
    title = axes.get_title()
    assert "2**-10" in title
    assert "threshold 0.001 rounded down" in title


def test_a_threshold_on_a_slot_edge_is_exact(collapsing):
    run, outputs = collapsing
    (axes,) = run.plot.dead_chart(threshold=EDGE * 4).axes
    assert_lines_match(axes, below(outputs, EDGE * 4), LAYERS)
    assert "rounded" not in axes.get_title()


def test_dead_lines_stay_inside_the_frame(collapsing):
    run, _ = collapsing
    (axes,) = run.plot.dead_chart().axes
    # A line at 0 (no zero in the Linear's outputs) or at 1 is not on the frame's edge.
    assert axes.get_ylim() == (-0.05, 1.05)
    assert min(line.get_ydata().min() for line in layer_lines(axes)) == 0
    (axes,) = run.plot.dead_chart(threshold=THRESHOLD).axes
    assert axes.get_ylim() == (-0.05, 1.05)
    assert max(line.get_ydata().max() for line in layer_lines(axes)) == 1


def assert_distinguishable(axes):
    """Each layer's own dash pattern and colour, widths narrowing in drawing order, a legend."""
    lines = layer_lines(axes)
    styles = [(line.get_linestyle(), to_rgba(line.get_color())) for line in lines]
    assert len({style for style, _ in styles}) == len(LAYERS)  # not by colour alone
    assert len(set(styles)) == len(LAYERS)
    # Drawn first to last, each narrower than the one before: none hides one below it.
    widths = [line.get_linewidth() for line in lines]
    assert widths == sorted(widths, reverse=True)
    assert len(set(widths)) == len(LAYERS)
    legend = axes.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == LAYERS
    for handle, line in zip(legend.legend_handles, lines, strict=True):
        assert handle.get_linestyle() == line.get_linestyle()
        assert to_rgba(handle.get_color()) == to_rgba(line.get_color())
        assert handle.get_linewidth() == line.get_linewidth()


def test_coinciding_lines_stay_distinguishable(collapsing):
    run, _ = collapsing
    (axes,) = run.plot.dead_chart().axes
    first, _, last = (line.get_ydata() for line in layer_lines(axes))
    np.testing.assert_array_equal(first, last)  # both Linear layers: no exact zero, ever
    assert_distinguishable(axes)
    (axes,) = run.plot.dead_chart(threshold=THRESHOLD).axes
    ends = [line.get_ydata()[-1] for line in layer_lines(axes)]
    assert ends == [1.0] * len(LAYERS)  # every layer's line ends on the same point
    assert_distinguishable(axes)


@pytest.mark.parametrize(
    ("threshold", "error"),
    [
        (0, ValueError),
        (-1e-3, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (1e-40, ValueError),  # below the smallest slot edge, 2**-126: nothing could count
        (True, TypeError),
        ("1e-3", TypeError),
    ],
)
def test_a_bad_threshold_is_named(run, threshold, error):
    with pytest.raises(error, match=r"^threshold:"):
        run.plot.dead_chart(threshold=threshold)


def test_a_threshold_needs_log2_histograms(linear_run):
    with pytest.raises(ValueError, match=r"^threshold:.*log2"):
        linear_run.plot.dead_chart(threshold=THRESHOLD)
    linear_run.plot.dead_chart()  # exact zeros need no histogram
