"""Matplotlib figures of a stored run: ``layerscope.load(path).plot.stats()`` and the like.

Every method returns a ``matplotlib.figure.Figure`` made without pyplot, so nothing is left in
pyplot's global state: show it in a notebook by leaving it as a cell's value, or write it with
``fig.savefig("x.png")``. Each reads only the columns and rows it draws, through ``run.sql``.
matplotlib is imported when a figure is made (``pip install 'layerscope[plot]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from layerscope._imports import require
from layerscope.plots import _attention, _distribution, _images, _lines, _precision
from layerscope.plots._attention import AttentionModules
from layerscope.plots._select import Modules

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables


from layerscope.plots._attention import head_matrix
from layerscope.plots._histograms import histogram_edges, widen
from layerscope.plots._images import LOG_SCALE_STATS
from layerscope.plots._select import (
    DEFAULT_TENSOR,
    PHASES,
    PICKED_MODULES,
    check_kind,
    check_phase,
    check_stat,
    select_modules,
)
from layerscope.plots._source import RunTables
from layerscope.plots._value_axis import is_linear, value_axis

__all__ = [
    "DEFAULT_TENSOR",
    "LOG_SCALE_STATS",
    "PHASES",
    "PICKED_MODULES",
    "RunPlots",
    "RunTables",
    "check_kind",
    "check_phase",
    "check_stat",
    "head_matrix",
    "histogram_edges",
    "is_linear",
    "select_modules",
    "value_axis",
    "widen",
]


class RunPlots:
    """The figures of one run; ``run.plot`` gives one.

    ``modules`` selects layers: None for all, a list of names, or a regex searched in each
    name; layers are drawn in model order. ``phase`` is ``"train"`` or ``"eval"``. Each
    figure shows rank 0 (the lowest rank) and the first call of each module.

    Example::

        run = layerscope.load("runs/mnist")
        run.plot.stats(kind="activation", stats=("mean", "std")).savefig("act.png")
    """

    def __init__(self, run: RunTables) -> None:
        require("matplotlib", "plot")
        self.run = run

    def __repr__(self) -> str:
        return f"<RunPlots of {self.run!r}>"

    def stats(
        self,
        kind: str = "activation",
        stats: Sequence[str] = ("mean", "std"),
        *,
        modules: Modules = None,
        phase: str = "train",
        tensor: str | None = None,
    ) -> Figure:
        """One subplot per statistic, one line per layer over steps.

        ``tensor`` defaults to the kind's main one (``out`` or ``weight``).
        """
        return _lines.stats_figure(self.run, kind, stats, modules, phase, tensor)

    def color_dim(
        self,
        kind: str = "activation",
        modules: Modules = None,
        *,
        phase: str = "train",
        tensor: str | None = None,
    ) -> Figure:
        """Per layer a panel: its histogram over steps, colour log(1 + count).

        fastai's "colorful dimension": a healthy layer is a steady band; one collapsing
        towards zero, or spreading out, shows as a band that sinks or widens. A log2
        histogram (the default) has rows of log2 |value|, from the lowest to the highest
        that holds a count (zeros and Infs have no row). A linear one
        (``histogram=("linear", lo, hi, bins)``) has rows in value units from lo to hi, and
        beyond each end a band for its open slot, ticked "< lo" and "≥ hi": the values below
        lo and those at or above hi.
        """
        return _images.color_dim(self.run, kind, modules, phase, tensor)

    def dead_chart(
        self,
        kind: str = "activation",
        *,
        modules: Modules = None,
        phase: str = "train",
        threshold: float | None = None,
    ) -> Figure:
        """Per layer the fraction of its values that are dead over steps, from 0 to 1.

        ``threshold=None`` counts exact zeros (``zero_frac``): a ReLU's dead units. A
        magnitude counts the values with ``|x| < threshold``, read off the run's log2
        histograms, as miniai's dead chart counts its histograms' lowest bins: it shows a
        layer whose outputs collapse towards zero without reaching it (a Conv2d's, a
        LayerNorm's), where the exact zeros stay at 0. The histogram's slot edges are powers
        of two: a threshold between two is rounded down to the lower one (1e-3 counts
        ``|x| < 2**-10``, about 0.000977), so every value counted is below the threshold; the
        title says the edge used. Fractions are of all the elements counted.

        Lines that lie on each other stay visible: each layer has its own dash pattern, and
        the first the widest line, each next one narrower, drawn over it.

        Raises:
            ValueError: ``threshold`` is not finite, below 2**-126 (the lowest slot edge), or
                the run recorded no log2 histograms (a linear one's bins are of values, not
                magnitudes).
            TypeError: ``threshold`` is not a number.

        Example::

            run.plot.dead_chart(modules="relu")  # exact zeros
            run.plot.dead_chart(modules="conv", threshold=1e-3)  # |x| < 2**-10
        """
        return _lines.dead_chart(self.run, kind, modules, phase, threshold)

    def heatmap(
        self,
        stat: str = "absmax",
        kind: str = "grad",
        *,
        modules: Modules = None,
        phase: str = "train",
        tensor: str | None = None,
    ) -> Figure:
        """Layers (rows) by steps (columns) of one statistic.

        Magnitudes (absmax, l2, std, counts) get a log colour scale, others a linear one.
        """
        return _images.heatmap(self.run, stat, kind, modules, phase, tensor)

    def precision(
        self,
        fmt: str = "e4m3",
        kind: str = "grad",
        *,
        modules: Modules = None,
        phase: str = "train",
        tensor: str | None = None,
        which: str = "lost",
    ) -> Figure:
        """Layers (rows) by steps (columns) of the fraction of values ``fmt`` would lose.

        ``fmt`` is ``"e4m3"``, ``"e5m2"``, ``"fp16"`` or ``"bf16"``; ``which`` is
        ``"lost"`` (values that would overflow or flush to zero), ``"overflow"`` or
        ``"underflow"``. Log colour scale; grey where nothing is lost. The counts are the
        run's ``{fmt}_over`` and ``{fmt}_under`` (``layerscope.precision`` reads them).

        Raises:
            ValueError: an unknown ``fmt`` or ``which``, or a run without the counts.

        Example::

            run.plot.precision("e4m3", kind="grad").savefig("fp8-grads.png")
        """
        return _precision.precision_heatmap(self.run, fmt, kind, modules, phase, tensor, which)

    def attention(
        self,
        module: AttentionModules = None,
        *,
        value: str = "entropy_frac",
        phase: str = "train",
    ) -> Figure:
        """Per attention module a panel: its heads (rows) by recorded steps (columns).

        Reads the ``attention`` table (``watch(model, attention=True)``). The colour is
        ``value``: ``"entropy_frac"`` (each query's attention entropy over the log of the keys
        it may attend to, averaged: 1 spread evenly, 0 all on one key), ``"entropy_mean"`` or
        ``"entropy_min"`` (nats, from 0 to the log of the most keys), or ``"max_prob"`` (the
        largest probability, averaged over queries). Red is a collapse (entropy near 0,
        probability near 1), blue attention spread evenly; grey a step a head has no row.
        Rows are heads, ``call:head`` where a module makes several attention calls a pass;
        columns the steps any panel recorded. ``module`` is None for every module that made
        attention calls, in model order, one's name, a regex searched in their names, or a
        list of names. Shows the lowest rank.

        Raises:
            ValueError: the run recorded no attention (or none in ``phase``), an unknown
                ``value``, or a ``module`` that made no attention call.

        Example::

            run.plot.attention().savefig("heads.png")
            scope.plot.attention("blocks.2.attn", value="max_prob")
        """
        return _attention.attention_heatmap(self.run, module, value, phase)

    def grad_norms(self, *, modules: Modules = None, phase: str = "train") -> Figure:
        """The L2 norm of each layer's weight gradient over steps, log y."""
        return _lines.grad_norms(self.run, modules, phase)

    def update_ratio(self, *, modules: Modules = None, phase: str = "train") -> Figure:
        """l2(update) / l2(weight) of each layer's weight over steps, log y, 1e-3 band shaded.

        Raises:
            ValueError: the run recorded no ``update`` (watch with ``kinds=`` holding it).
        """
        return _lines.update_ratio(self.run, modules, phase)

    def histogram(
        self,
        module: str,
        kind: str = "activation",
        tensor: str = "out",
        steps: Sequence[int] | None = None,
        *,
        phase: str = "train",
    ) -> Figure:
        """One tensor's distribution at chosen steps (default: a few spread over the run).

        Fractions of its elements per slot: over log2 |value| for a log2 histogram, or in
        value units from lo to hi for a linear one, with its open slots (values below lo, at
        or above hi) drawn beyond each end and ticked "< lo" and "≥ hi".
        """
        return _distribution.histogram_figure(self.run, module, kind, tensor, steps, phase)

    def scalars(self, names: Sequence[str] | str | None = None) -> Figure:
        """Loss and other scalars over steps, a vertical line at each alert, by severity."""
        return _lines.scalars_figure(self.run, names)
