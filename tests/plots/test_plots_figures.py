"""Each figure draws the run's own statistics, layers in model order, labelled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import LogNorm, to_rgba
from matplotlib.figure import Figure
from tests.plots.conftest import LAYERS, assert_lines_match, reference, widened_histograms

import layerscope

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_stats_draws_one_line_per_layer_per_statistic(run):
    fig = run.plot.stats(kind="activation", stats=("mean", "std"))
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2
    for axes, stat in zip(fig.axes, ("mean", "std"), strict=True):
        assert_lines_match(axes, reference(run, "activation", "out", stat), LAYERS)
        assert axes.get_ylabel() == stat
        assert axes.get_xlabel() == "step"
        assert [text.get_text() for text in axes.get_legend().get_texts()] == LAYERS


@pytest.mark.parametrize("modules", [["2", "0"], "^[02]$"])
def test_modules_by_list_or_regex_keep_model_order(run, modules):
    fig = run.plot.stats(stats=("absmax",), modules=modules)
    assert_lines_match(fig.axes[0], reference(run, "activation", "out", "absmax"), ["0", "2"])


def test_heatmap_rows_are_layers_columns_steps(run):
    fig = run.plot.heatmap(stat="absmax", kind="grad")
    image = fig.axes[0].images[0]
    expected = reference(run, "grad", "out", "absmax")
    np.testing.assert_allclose(image.get_array(), np.stack([expected[n][1] for n in LAYERS]))
    assert isinstance(image.norm, LogNorm)
    labels = [tick.get_text() for tick in fig.axes[0].get_yticklabels()]
    assert labels == LAYERS
    assert fig.axes[0].get_xlabel() == "step"


def test_heatmap_of_a_mean_is_linear(run):
    image = run.plot.heatmap(stat="mean", kind="activation", modules=["1"]).axes[0].images[0]
    assert not isinstance(image.norm, LogNorm)
    np.testing.assert_allclose(
        image.get_array()[0], reference(run, "activation", "out", "mean")["1"][1]
    )


def test_grad_norms_are_weight_gradient_l2_on_log_y(run):
    (axes,) = run.plot.grad_norms().axes
    assert_lines_match(axes, reference(run, "weight_grad", "weight", "l2"), ["0", "2"])
    assert axes.get_yscale() == "log"


def test_update_ratio_divides_update_by_weight(run):
    (axes,) = run.plot.update_ratio().axes
    updates = reference(run, "update", "weight", "l2")
    weights = reference(run, "weight", "weight", "l2")
    expected = {name: (updates[name][0], updates[name][1] / weights[name][1]) for name in updates}
    assert_lines_match(axes, expected, ["0", "2"])
    assert axes.get_yscale() == "log"
    (band,) = axes.patches
    lows_highs = band.get_path().get_extents(band.get_transform() - axes.transData)
    assert lows_highs.y0 == pytest.approx(1e-4)
    assert lows_highs.y1 == pytest.approx(1e-2)


def test_update_ratio_without_updates_names_kinds(plain_run):
    with pytest.raises(ValueError, match="kinds="):
        plain_run.plot.update_ratio()


def test_color_dim_images_are_log_counts_of_the_histograms(run):
    fig = run.plot.color_dim()
    assert len(fig.axes) == len(LAYERS)
    edges = np.asarray(run.meta["histogram_edges"])
    for axes, name in zip(fig.axes, LAYERS, strict=True):
        steps, counts = widened_histograms(run, name)
        magnitudes = counts[1:-1]  # zeros and Infs have no log2 place
        held = np.flatnonzero(magnitudes.sum(axis=1)) + 1
        expected = np.log1p(counts[held.min() : held.max() + 1])
        (image,) = axes.images
        np.testing.assert_allclose(image.get_array(), expected)
        # The rows span the log2 magnitudes of those slots.
        bottom, top = image.get_extent()[2:]
        assert bottom == np.log2(edges[held.min()])
        assert top == np.log2(edges[held.max()]) + 1
        assert axes.get_ylabel() == "log2 |value|"
        assert image.get_array().shape[1] == len(steps)


def test_histogram_overlays_fractions_at_spread_steps(run):
    (axes,) = run.plot.histogram("0").axes
    steps, counts = widened_histograms(run, "0")
    lines = axes.get_lines()
    assert [line.get_label() for line in lines] == ["step 0", "step 1", "step 3", "step 4"]
    for line in lines:
        column = list(steps).index(int(line.get_label().split()[1]))
        fraction = counts[:, column] / counts[:, column].sum()
        exponents, drawn = line.get_xdata(), line.get_ydata()
        # The last point closes the last slot's step: one power of two on, the same height.
        assert exponents[-1] == exponents[-2] + 1
        assert drawn[-1] == drawn[-2]
        edges = np.asarray(run.meta["histogram_edges"])
        slots = np.searchsorted(np.log2(edges[1:-1]), exponents[:-1]) + 1
        np.testing.assert_array_equal(np.log2(edges[slots]), exponents[:-1])
        np.testing.assert_allclose(drawn[:-1], fraction[slots])
        # Every non-zero magnitude slot is drawn.
        assert fraction[1:-1].sum() == pytest.approx(drawn[:-1].sum())
    assert axes.get_xlabel().startswith("log2")


def test_histogram_at_chosen_steps(run):
    lines = run.plot.histogram("2", kind="grad", steps=[1, 2]).axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["step 1", "step 2"]


def test_scalars_draw_each_scalar_and_alert_lines(run, nan_run):
    fig = run.plot.scalars()
    assert [axes.get_ylabel() for axes in fig.axes] == ["loss", "lr"]
    scalars = run.scalars
    loss = scalars[scalars["name"] == "loss"].sort_values("step")
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), loss["step"])
    np.testing.assert_allclose(line.get_ydata(), loss["value"])
    assert not fig.axes[0].collections  # no alerts in a healthy run

    (axes,) = nan_run.plot.scalars(names="loss").axes
    (marks,) = axes.collections
    assert marks.get_label() == "alert: error"
    # One vertical line at the alert's step, from the bottom of the axes to the top.
    ((start, end),) = marks.get_segments()
    assert (start[0], end[0]) == (2, 2)
    assert (start[1], end[1]) == (0, 1)
    np.testing.assert_allclose(marks.get_color()[0], to_rgba("tab:red", alpha=0.6))
    assert "alert: error" in [text.get_text() for text in axes.get_legend().get_texts()]


def test_savefig_writes_a_png(run, tmp_path: Path):
    path = tmp_path / "x.png"
    run.plot.heatmap().savefig(path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def every_figure(run: layerscope.Run, update: bool = True) -> list[Figure]:
    figures = [
        run.plot.stats(),
        run.plot.color_dim(),
        run.plot.dead_chart(),
        run.plot.heatmap(),
        run.plot.heatmap(stat="mean", kind="activation"),
        run.plot.grad_norms(),
        run.plot.histogram("1"),
        run.plot.scalars(),
    ]
    return [*figures, run.plot.update_ratio()] if update else figures


@pytest.mark.parametrize("name", ["nan_run", "single_step_run"])
def test_nan_and_single_step_runs_still_draw(request, name, tmp_path: Path):
    run = request.getfixturevalue(name)
    for index, fig in enumerate(every_figure(run)):
        path = tmp_path / f"{index}.png"
        fig.savefig(path, dpi=20)  # a small PNG: drawing every artist is what is tested
        assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_nan_run_draws_its_nans(nan_run):
    (axes, _) = nan_run.plot.stats().axes
    last = [line.get_ydata()[-1] for line in axes.get_lines()]
    assert np.isnan(last).all()  # NaN from step 2 on: drawn as gaps, not dropped


def test_plot_does_not_touch_pyplot(run):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    every_figure(run)
    assert plt.get_fignums() == before
