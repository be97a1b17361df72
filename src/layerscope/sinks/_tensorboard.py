"""TensorBoard: statistics as scalars and histograms in a TensorBoard log directory."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from layerscope._imports import require
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.sinks._tags import (
    DEFAULT_STATS,
    TaggedRow,
    as_list,
    attention_values,
    chosen_stats,
    row_bins,
    tagged_rows,
)

_QUEUE = 4096  # events the event writer's thread may hold before an add waits


class TensorBoard:
    """Writes each recorded tensor's statistics as TensorBoard scalars and its histogram.

    Tags read ``{phase}/{kind}/{module}/{tensor}/{stat}``, as in the W&B and MLflow sinks; the
    root module is ``<root>``, and a module's second and later calls in a step add ``#{call}``
    to the tensor (``out#1``).
    A log2 histogram shows as a histogram of the values over power-of-two bins of each sign
    (``signed_histograms``: the recorder counts it split by sign for this sink), with one bin
    of zeros and subnormals between them; Inf and NaN are left to ``inf_count`` and
    ``nan_count``. A run recorded without the split and replayed by ``layerscope export``
    shows ``|x|`` over its bins, zeros to Inf. Scalars from ``scope.step(**scalars)`` keep
    their own names. Needs ``layerscope[tensorboard]``.

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

    @property
    def signed_histograms(self) -> bool:
        """Whether the recorder should count the log2 histogram split by sign: with histograms."""
        return self.histograms

    def start(self, info: RunInfo) -> None:
        """Open the event file (imports tensorboard here, not at ``import layerscope``)."""
        require("tensorboard", "tensorboard")
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(self.logdir, max_queue_size=_QUEUE)
        self._edges = info.histogram_edges
        histogram = info.config.get("histogram") or {}
        self._log2 = histogram.get("kind") == "log2"

    def write(self, records: Records) -> None:
        """Write one event per step: its scalars, a value per statistic and row, histograms.

        One event holding all of a step's values, where an event a value cost a protocol
        buffer and a checksum each: the most of the sink's time.
        """
        from tensorboard.compat.proto.summary_pb2 import Summary

        values: dict[int, list[Any]] = defaultdict(list)
        for step, name, value in (*records.scalars, *attention_values(records.attention)):
            values[step].append(Summary.Value(tag=name, simple_value=value))
        chunk = records.stats
        if chunk is not None:
            columns = chunk.columns()
            # The columns a histogram's summary needs, as lists once: indexing a tensor per
            # row cost more than the rest of the write.
            needed = ("numel", "mean", "l2", "nan_count", "inf_count", "min", "max", "absmax")
            lists = {name: as_list(columns[name]) for name in needed if name in columns}
            for row in tagged_rows(chunk, self.stats, self.histograms):
                added = values[row.step]
                for name, value in row.values.items():
                    added.append(Summary.Value(tag=f"{row.tag}/{name}", simple_value=value))
                if row.counts is not None:
                    histogram = self._histogram(row, lists)
                    if histogram is not None:
                        added.append(Summary.Value(tag=row.tag, histo=histogram))
        self._add_events(values)

    def _add_events(self, values: dict[int, list[Any]]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        now = time.time()
        for step in sorted(values):
            summary = Summary(value=values[step])
            self._writer.add_event(Event(wall_time=now, step=step, summary=summary))

    def _histogram(self, row: TaggedRow, lists: dict[str, list[Any]]) -> Any:
        """The histogram of ``row`` as TensorBoard's protocol buffer; None if it is empty."""
        from tensorboard.compat.proto.summary_pb2 import HistogramProto

        counts, first = row.counts, row.first
        if not counts or self._edges is None:
            return None

        def value(name: str) -> float | None:
            found = lists.get(name)
            cell = found[row.index] if found is not None else None
            # NaN: a value not known (a stored run's file without the column), as None
            return float(cell) if cell is not None and cell == cell else None

        magnitudes = self._log2 and not row.signed
        low = 0.0 if magnitudes else value("min")
        high = value("absmax" if magnitudes else "max")
        if row.signed:  # the occupied signed bins, their open ends closed at min and max
            bins = row_bins(row, self._edges, low, high)
            if bins is None:
                return None
            counts, bounds = bins
            floor, limits = bounds[0], bounds[1:]
        else:
            # Upper limit of each slot; the last slot (non-finite or overflow) gets a finite one.
            uppers = [*self._edges[1:], math.inf]
            top = uppers[first : first + len(counts)]
            limits = [u if math.isfinite(u) else 3.4e38 for u in top]
            floor = limits[0]
        mean, l2 = value("mean"), value("l2")
        finite = int(value("numel") or 0) - int(value("nan_count") or 0)
        finite -= int(value("inf_count") or 0)
        return HistogramProto(
            min=_finite(low, floor),
            max=_finite(high, limits[-1]),
            num=sum(counts),
            sum=_finite(mean * finite if mean is not None else None, 0.0),
            sum_squares=_finite(l2 * l2 if l2 is not None else None, 0.0),
            bucket_limit=limits,
            bucket=counts,
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
