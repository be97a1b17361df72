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
from layerscope.plots import _histograms, _images, _lines
from layerscope.plots._select import Modules

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

__all__ = ["RunPlots"]


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
        """Per layer a panel: its log2 histogram over steps, colour log(1 + count).

        fastai's "colorful dimension": a healthy layer is a steady band; one collapsing
        towards zero, or spreading out, shows as a band that sinks or widens.
        """
        return _images.color_dim(self.run, kind, modules, phase, tensor)

    def dead_chart(
        self, kind: str = "activation", *, modules: Modules = None, phase: str = "train"
    ) -> Figure:
        """Per layer the fraction of exact zeros over steps (dead ReLUs), from 0 to 1."""
        return _lines.dead_chart(self.run, kind, modules, phase)

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

    def grad_norms(self, *, modules: Modules = None, phase: str = "train") -> Figure:
        """The L2 norm of each layer's weight gradient over steps, log y."""
        return _lines.grad_norms(self.run, modules, phase)

    def update_ratio(self, *, modules: Modules = None, phase: str = "train") -> Figure:
        """l2(update) / l2(weight) of each layer's weight over steps, log y, 1e-3 band shaded.

        Raises:
            ValueError: the run recorded no ``update`` (watch with ``capture=`` holding it).
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
        """One tensor's distribution at chosen steps (default: a few spread over the run)."""
        return _histograms.histogram_figure(self.run, module, kind, tensor, steps, phase)

    def scalars(self, names: Sequence[str] | str | None = None) -> Figure:
        """Loss and other scalars over steps, a vertical line at each alert, by severity."""
        return _lines.scalars_figure(self.run, names)
