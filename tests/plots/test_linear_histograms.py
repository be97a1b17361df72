"""A run recorded with ``histogram=("linear", lo, hi, bins)`` is drawn in value units.

Its slots are: values below lo (slot 0), the bins from lo to hi, values at or above hi (the
last). Each figure draws every slot: the bins at their values, the two open slots as bands
beyond lo and hi whose ticks say what they hold; nothing is called log2 or zeros.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tests.plots.conftest import LAYERS, LINEAR, layer_lines, widened_histograms

import layerscope
from layerscope.plots import animation

_, LO, HI, BINS = LINEAR
BELOW, ABOVE = f"< {LO:g}", f"≥ {HI:g}"


def fractions(counts):
    """Each column of (slots, steps) counts as fractions of its elements."""
    return counts / counts.sum(axis=0)


def assert_value_bounds(bounds, run):
    """Slot k of the drawn axis spans bounds[k] to bounds[k + 1], in value units."""
    edges = np.asarray(run.meta["histogram_edges"])
    assert len(bounds) == BINS + 3  # every slot, the open ones too
    np.testing.assert_array_equal(bounds[1:-1], edges[1:])  # lo, ..., hi: the run's own edges
    assert bounds[1] == LO
    assert bounds[-2] == HI
    assert bounds[0] < LO
    assert bounds[-1] > HI


def assert_open_slots_named(ticks, labels, bounds):
    """The open slots' ticks, at their middles, say what they hold; no other tick is outside."""
    named = dict(zip(labels, ticks, strict=True))
    assert named[BELOW] == pytest.approx((bounds[0] + bounds[1]) / 2)
    assert named[ABOVE] == pytest.approx((bounds[-2] + bounds[-1]) / 2)
    inside = [tick for label, tick in named.items() if label not in (BELOW, ABOVE)]
    assert inside
    assert all(LO <= tick <= HI for tick in inside)


def test_color_dim_draws_every_slot_in_value_units(linear_run):
    fig = linear_run.plot.color_dim()
    assert len(fig.axes) == len(LAYERS)
    for axes, name in zip(fig.axes, LAYERS, strict=True):
        steps, counts = widened_histograms(linear_run, name)
        assert not axes.images  # no log2 image
        (mesh,) = axes.collections
        np.testing.assert_allclose(mesh.get_array(), np.log1p(counts))
        corners = mesh.get_coordinates()  # (slots + 1, steps + 1, xy)
        bounds = corners[:, 0, 1]
        assert_value_bounds(bounds, linear_run)
        np.testing.assert_array_equal(corners[0, :, 0], np.arange(len(steps) + 1) - 0.5)
        assert axes.get_ylabel() == "value"
        labels = [label.get_text() for label in axes.get_yticklabels()]
        assert_open_slots_named(axes.get_yticks(), labels, bounds)
        assert axes.get_ylim() == (bounds[0], bounds[-1])


def test_histogram_draws_every_slot_in_value_units(linear_run):
    (axes,) = linear_run.plot.histogram("0").axes
    steps, counts = widened_histograms(linear_run, "0")
    expected = fractions(counts)
    # Both open slots hold values.
    assert expected[0].max() > 0
    assert expected[-1].max() > 0
    lines = layer_lines(axes)  # not the lines at lo and hi
    assert [line.get_label() for line in lines] == [f"step {step}" for step in steps]
    for line, column in zip(lines, range(len(steps)), strict=True):
        bounds, drawn = line.get_xdata(), line.get_ydata()
        assert_value_bounds(bounds, linear_run)
        np.testing.assert_allclose(drawn[:-1], expected[:, column], rtol=1e-12)
        assert drawn[-1] == drawn[-2]  # the last slot's step has a width too
    assert axes.get_xlabel() == "value"
    labels = [label.get_text() for label in axes.get_xticklabels()]
    assert_open_slots_named(axes.get_xticks(), labels, bounds)


def test_animation_frames_draw_every_slot_and_name_the_open_ones(linear_run, monkeypatch):
    drawn = {}

    def keep(fig, draw, frames, path, fps):
        (axes,) = fig.axes
        for index in range(frames):
            draw(index)
            caption = axes.texts[0].get_text()
            step = int(re.search(r"step (\d+)", caption).group(1))
            bars = axes.patches
            lefts = [bar.get_x() for bar in bars]
            bounds = np.array([*lefts, lefts[-1] + bars[-1].get_width()])
            drawn[step] = (bounds, np.array([bar.get_height() for bar in bars]), caption)
            # The open slots' bars are hatched: counts of everything beyond, not bins.
            assert [bool(bar.get_hatch()) for bar in bars] == [True] + [False] * BINS + [True]
        assert axes.get_xlabel() == "value"
        labels = [label.get_text() for label in axes.get_xticklabels()]
        assert_open_slots_named(axes.get_xticks(), labels, bounds)

    monkeypatch.setattr(animation, "_save", keep)
    layerscope.animate(linear_run, "0", path=linear_run.path + "/l.gif", steps=[2, 0])
    steps, counts = widened_histograms(linear_run, "0")
    expected = fractions(counts)
    assert sorted(drawn) == [0, 2]
    for step, (bounds, heights, caption) in drawn.items():
        column = list(steps).index(step)
        assert_value_bounds(bounds, linear_run)
        np.testing.assert_allclose(heights, expected[:, column], rtol=1e-12)
        assert "zeros" not in caption
        assert f"{BELOW}: {expected[0, column]:.1%}" in caption
        assert f"{ABOVE}: {expected[-1, column]:.1%}" in caption
