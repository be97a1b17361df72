"""Line figures: one line per layer over steps, and the run's scalars with its alerts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.plots._labels import drawn_name
from layerscope.plots._near_zero import near_zero_fractions
from layerscope.plots._select import (
    Modules,
    check_stat,
    figure,
    layer_matrix,
    read_rows,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

SEVERITY_COLORS = {"info": "tab:blue", "warning": "tab:orange", "error": "tab:red"}
# Adam-like optimizers move weights by about a thousandth of their size per step.
UPDATE_BAND = (1e-4, 1e-2)
# More layers than this are told apart by colour (first to last), not by a legend.
LEGEND_LIMIT = 12
DEPTH_COLORMAP = "viridis"
# Where lines often coincide (dead fractions pinned at 0 or 1), each layer gets its own dash
# pattern, and a width from WIDEST (the first) down to NARROWEST (the last): each line, drawn
# over the earlier ones, leaves their edges and its dash gaps showing.
DASHES = ("-", "--", "-.", ":")
WIDEST, NARROWEST = 3.5, 1.0
# The dead chart's fractions: from 0 to 1, with room so that a line at either is not the frame.
DEAD_LIMITS = (-0.05, 1.05)


def draw_layers(
    axes: Axes,
    steps: np.ndarray,
    values: np.ndarray,
    layers: Sequence[str],
    ylabel: str,
    *,
    coinciding: bool = False,
) -> None:
    """One line per layer (rows of ``values``), labelled by module name.

    Up to ``LEGEND_LIMIT`` layers get a legend; more are coloured by depth, with a colour bar
    from the first layer to the last, as a legend of hundreds of names says nothing.
    ``coinciding``: lines that often lie on each other get dashes and widths of their own
    (up to ``LEGEND_LIMIT`` layers; more are told apart by colour only).
    """
    # A single recorded step is a point: without a marker it would not show.
    marker = "o" if len(steps) == 1 else None
    names = [drawn_name(name or "(root)") for name in layers]
    many = len(layers) > LEGEND_LIMIT
    colors = _depth_colors(len(layers)) if many else [None] * len(layers)
    styles: list[dict[str, Any]] = [{"linewidth": 0.8 if many else None}] * len(layers)
    if coinciding and not many:
        styles = _distinct_styles(len(layers))
    for name, row, color, style in zip(names, values, colors, styles, strict=True):
        axes.plot(steps, row, marker=marker, label=name, color=color, **style)
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    if not many:
        axes.legend(title="module", fontsize="small", loc="best")
        return
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    scale = ScalarMappable(Normalize(0, len(layers) - 1), cmap=DEPTH_COLORMAP)
    owner = axes.get_figure()
    assert owner is not None  # the axes were made by a figure
    bar = owner.colorbar(scale, ax=axes, label="module (model order)")
    bar.set_ticks([0, len(layers) - 1], labels=[names[0], names[-1]])


def _distinct_styles(count: int) -> list[dict[str, Any]]:
    """Dash pattern and width of each of ``count`` lines, in drawing order."""
    widths = np.linspace(WIDEST, NARROWEST, count) if count > 1 else [None]
    return [
        {"linestyle": DASHES[index % len(DASHES)], "linewidth": width}
        for index, width in enumerate(widths)
    ]


def _depth_colors(count: int) -> list[Any]:
    from matplotlib import colormaps

    return list(colormaps[DEPTH_COLORMAP](np.linspace(0.0, 1.0, count)))


def stats_figure(
    run: RunTables,
    kind: str,
    stats: Sequence[str],
    modules: Modules,
    phase: str,
    tensor: str | None,
) -> Figure:
    """One subplot per statistic, one line per layer over steps."""
    if isinstance(stats, str):
        stats = (stats,)
    if not stats:
        raise ValueError("stats: expected at least one statistic, got none")
    for stat in stats:
        check_stat(run, stat, "stats")
    layers, frame = read_rows(
        run, list(dict.fromkeys(stats)), kind=kind, phase=phase, modules=modules, tensor=tensor
    )
    fig, axes = figure(len(stats))
    for ax, stat in zip(axes, stats, strict=True):
        steps, values = layer_matrix(frame, layers, stat)
        draw_layers(ax, steps, values, layers, stat)
        ax.set_title(f"{kind} {stat}")
    return fig


def dead_chart(
    run: RunTables, kind: str, modules: Modules, phase: str, threshold: object = None
) -> Figure:
    """Per layer the fraction of exact zeros, or of values below ``threshold``, over steps."""
    if threshold is None:
        check_stat(run, "zero_frac")
        layers, frame = read_rows(run, ["zero_frac"], kind=kind, phase=phase, modules=modules)
        steps, values = layer_matrix(frame, layers, "zero_frac")
        ylabel, title = "zero fraction", f"dead units: zero fraction of {kind}"
    else:
        layers, steps, values, edge = near_zero_fractions(run, threshold, kind, modules, phase)
        ylabel = f"fraction |value| < {edge:.3g}"
        title = f"near zero: {kind} with |value| < 2**{np.log2(edge):.0f}"
        if edge != threshold:
            title += f" (threshold {threshold:g} rounded down)"
    fig, (ax,) = figure(1, height=4.0)
    draw_layers(ax, steps, values, layers, ylabel, coinciding=True)
    ax.set_ylim(*DEAD_LIMITS)
    ax.set_title(title)
    return fig


def grad_norms(run: RunTables, modules: Modules, phase: str) -> Figure:
    """L2 norm of each layer's weight gradient over steps, on a log scale."""
    check_stat(run, "l2")
    layers, frame = read_rows(run, ["l2"], kind="weight_grad", phase=phase, modules=modules)
    steps, values = layer_matrix(frame, layers, "l2")
    fig, (ax,) = figure(1, height=4.0)
    draw_layers(ax, steps, values, layers, "l2 of weight gradient")
    ax.set_yscale("log")
    ax.set_title("gradient norms")
    return fig


def update_ratio(run: RunTables, modules: Modules, phase: str) -> Figure:
    """l2(update) / l2(weight) of each layer's weight over steps, with the usual band shaded."""
    check_stat(run, "l2")
    has_update = run.sql("select count(*) as n from stats where kind = 'update'")["n"].iloc[0]
    if not has_update:
        raise ValueError(
            "the run has no 'update' rows: record them with "
            "layerscope.watch(..., optimizer=optimizer, kinds=(..., 'update'))"
        )
    layers, updates = read_rows(run, ["l2"], kind="update", phase=phase, modules=modules)
    _, weights = read_rows(run, ["l2"], kind="weight", phase=phase, modules=layers)
    steps, update_l2 = layer_matrix(updates, layers, "l2")
    weight_steps, weight_l2 = layer_matrix(weights, layers, "l2")
    # Align the weights on the update steps: a step without a weight row stays NaN.
    aligned = np.full_like(update_l2, np.nan)
    _, at_update, at_weight = np.intersect1d(steps, weight_steps, return_indices=True)
    aligned[:, at_update] = weight_l2[:, at_weight]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = update_l2 / aligned
    fig, (ax,) = figure(1, height=4.0)
    ax.axhspan(*UPDATE_BAND, color="tab:green", alpha=0.15, label="1e-4 to 1e-2")
    ax.axhline(1e-3, color="tab:green", linewidth=0.8, linestyle="--")
    draw_layers(ax, steps, ratio, layers, "l2(update) / l2(weight)")
    ax.set_yscale("log")
    ax.set_title("update / weight ratio")
    return fig


def scalars_figure(run: RunTables, names: Sequence[str] | str | None) -> Figure:
    """One subplot per scalar over steps, with a vertical line at each alert's step."""
    scalars = run.sql(
        "select step, name, value from scalars"
        " where rank = (select min(rank) from scalars) order by step"
    )
    recorded = list(dict.fromkeys(scalars["name"]))
    if isinstance(names, str):
        names = [names]
    if names is None:
        names = recorded
    if not names:
        raise ValueError("names: no scalars to draw (record them with scope.step(loss=...))")
    unknown = [name for name in names if name not in recorded]
    if unknown:
        raise ValueError(f"names: unknown scalars {unknown}; the run has {recorded}")
    alerts = run.sql(
        "select distinct step, severity from alerts where step is not null order by step"
    )
    fig, axes = figure(len(names))
    for ax, name in zip(axes, names, strict=True):
        rows = scalars[scalars["name"] == name]
        steps = rows["step"].to_numpy(dtype=np.int64)
        marker = "o" if len(steps) == 1 else None
        shown = drawn_name(name)
        ax.plot(steps, rows["value"].to_numpy(dtype=np.float64), marker=marker, label=shown)
        # One collection of vertical lines per severity: thousands of alerts draw at once.
        for severity, group in alerts.groupby("severity", sort=False):
            ax.vlines(
                group["step"].to_numpy(dtype=np.int64),
                0,
                1,
                transform=ax.get_xaxis_transform(),
                color=SEVERITY_COLORS.get(str(severity), "tab:gray"),
                alpha=0.6,
                linewidth=1.0,
                label=f"alert: {severity}",
            )
        ax.set_xlabel("step")
        ax.set_ylabel(shown)
        ax.legend(fontsize="small", loc="best")
    return fig
