"""TensorBoard: statistics as scalars and histograms in a TensorBoard log directory."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from layerscope._imports import require
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.sinks._tags import DEFAULT_STATS, TaggedRow, as_list, chosen_stats, tagged_rows

_QUEUE = 4096  # events the writer's thread may hold before an add waits


class TensorBoard:
    """Writes each recorded tensor's statistics as TensorBoard scalars and its histogram.

    Tags read ``{phase}/{kind}/{module}/{tensor}/{stat}``, as in the W&B and MLflow sinks; the
    root module is ``<root>``, and a module's second and later calls in a step add ``#{call}``
    to the tensor (``out#1``).
    A log2 histogram shows as a histogram of ``|x|`` over its power-of-two bins. Scalars from
    ``scope.step(**scalars)`` keep their own names. Needs ``layerscope[tensorboard]``.

    Args:
        logdir: the directory TensorBoard reads.
        stats: which statistics become scalar plots.
        histograms: whether to write histograms.

    Example::

        scope = layerscope.watch(model, sinks=[layerscope.sinks.TensorBoard("tb/exp1")])
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        stats: str | Sequence[str] = DEFAULT_STATS,
        histograms: bool = True,
    ) -> None:
        self.logdir = os.fspath(logdir)
        self.stats = chosen_stats(stats)
        self.histograms = histograms
        self._writer: Any = None
        self._edges: list[float] | None = None
        self._log2 = False

    def start(self, info: RunInfo) -> None:
        """Open the event file (imports tensorboard here, not at ``import layerscope``)."""
        require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        # A queue of 10 events (the default) made every add wait for the writer's thread.
        self._writer = SummaryWriter(self.logdir, max_queue=_QUEUE)
        self._edges = info.histogram_edges
        histogram = info.config.get("histogram") or {}
        self._log2 = histogram.get("kind") == "log2"

    def write(self, records: Records) -> None:
        """Add one scalar per statistic and row, one histogram per row, and the scalars."""
        writer = self._writer
        for step, name, value in records.scalars:
            writer.add_scalar(name, value, step)
        chunk = records.stats
        if chunk is None:
            return
        columns = chunk.columns()
        # The columns a histogram's summary needs, as lists once: indexing a tensor per row
        # cost more than the rest of the write.
        needed = ("numel", "mean", "l2", "nan_count", "inf_count", "min", "max", "absmax")
        lists = {name: as_list(columns[name]) for name in needed if name in columns}
        for row in tagged_rows(chunk, self.stats, self.histograms):
            for name, value in row.values.items():
                writer.add_scalar(f"{row.tag}/{name}", value, row.step)
            if row.counts is not None:
                self._histogram(row, lists)

    def _histogram(self, row: TaggedRow, lists: dict[str, list[Any]]) -> None:
        counts, first = row.counts, row.first
        if not counts or self._edges is None:
            return
        # Upper limit of each slot; the last slot (non-finite or overflow) gets a finite one.
        uppers = [*self._edges[1:], math.inf]
        limits = [u if math.isfinite(u) else 3.4e38 for u in uppers[first : first + len(counts)]]

        def value(name: str) -> float | None:
            found = lists.get(name)
            cell = found[row.index] if found is not None else None
            return float(cell) if cell is not None else None

        mean, l2 = value("mean"), value("l2")
        finite = int(value("numel") or 0) - int(value("nan_count") or 0)
        finite -= int(value("inf_count") or 0)
        low = 0.0 if self._log2 else value("min")
        high = value("absmax" if self._log2 else "max")
        self._writer.add_histogram_raw(
            row.tag,
            min=_finite(low, limits[0]),
            max=_finite(high, limits[-1]),
            num=sum(counts),
            sum=_finite(mean * finite if mean is not None else None, 0.0),
            sum_squares=_finite(l2 * l2 if l2 is not None else None, 0.0),
            bucket_limits=limits,
            bucket_counts=counts,
            global_step=row.step,
        )

    def flush(self) -> None:
        """Flush the event file."""
        if self._writer is not None:
            self._writer.flush()

    def close(self, summary: RunSummary) -> None:
        """Close the event file."""
        if self._writer is not None:
            self._writer.close()


def _finite(value: float | None, fallback: float) -> float:
    return value if value is not None and math.isfinite(value) else fallback
