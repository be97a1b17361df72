"""TensorBoard: statistics as scalars and histograms in a TensorBoard log directory."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from layerscope._imports import require
from layerscope.sinks._base import Records, RunInfo, RunSummary


class TensorBoard:
    """Writes each recorded tensor's statistics as TensorBoard scalars and its histogram.

    Tags read ``{phase}/{kind}/{module}/{tensor}/{stat}``; the root module is ``<root>``, and
    a module's second and later calls in a step add ``#{call}`` to the tensor (``out#1``).
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
        stats: Sequence[str] = ("mean", "std", "absmax", "l2", "zero_frac", "nan_count"),
        histograms: bool = True,
    ) -> None:
        self.logdir = os.fspath(logdir)
        self.stats = (stats,) if isinstance(stats, str) else tuple(stats)
        self.histograms = histograms
        self._writer: Any = None
        self._edges: list[float] | None = None
        self._log2 = False

    def start(self, info: RunInfo) -> None:
        """Open the event file (imports tensorboard here, not at ``import layerscope``)."""
        require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(self.logdir)
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
        values = {name: _as_list(columns[name]) for name in self.stats if name in columns}
        steps = _as_list(columns["step"])
        has_histogram = chunk.hist_valid() if chunk.hist is not None else []
        for row in range(len(chunk)):
            module = columns["module"][row] or "<root>"
            phase, kind = columns["phase"][row], columns["kind"][row]
            call = columns["call"][row]
            tensor = columns["tensor"][row] + (f"#{call}" if call else "")
            tag = f"{phase}/{kind}/{module}/{tensor}"
            for name, column in values.items():
                value = column[row]
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    writer.add_scalar(f"{tag}/{name}", value, steps[row])
            if self.histograms and chunk.hist is not None and has_histogram[row]:
                counts = [int(count) for count in chunk.hist[row].tolist()]
                self._histogram(tag, steps[row], counts, columns, row)

    def _histogram(self, tag: str, step: int, counts: list[int], columns: Any, row: int) -> None:
        nonzero = [slot for slot, count in enumerate(counts) if count]
        if not nonzero or self._edges is None:
            return
        first, last = nonzero[0], nonzero[-1]
        # Upper limit of each slot; the last slot (non-finite or overflow) gets a finite one.
        uppers = [*self._edges[1:], math.inf]
        limits = [u if math.isfinite(u) else 3.4e38 for u in uppers[first : last + 1]]
        numel = int(_as_list(columns["numel"])[row])
        mean, l2 = _value(columns, "mean", row), _value(columns, "l2", row)
        finite = numel - int(_value(columns, "nan_count", row) or 0)
        finite -= int(_value(columns, "inf_count", row) or 0)
        low = 0.0 if self._log2 else _value(columns, "min", row)
        high = _value(columns, "absmax" if self._log2 else "max", row)
        self._writer.add_histogram_raw(
            tag,
            min=_finite(low, limits[0]),
            max=_finite(high, limits[-1]),
            num=sum(counts),
            sum=_finite(mean * finite if mean is not None else None, 0.0),
            sum_squares=_finite(l2 * l2 if l2 is not None else None, 0.0),
            bucket_limits=limits,
            bucket_counts=counts[first : last + 1],
            global_step=step,
        )

    def flush(self) -> None:
        """Flush the event file."""
        if self._writer is not None:
            self._writer.flush()

    def close(self, summary: RunSummary) -> None:
        """Close the event file."""
        if self._writer is not None:
            self._writer.close()


def _as_list(column: Any) -> list[Any]:
    return column.tolist() if hasattr(column, "tolist") else list(column)


def _value(columns: Any, name: str, row: int) -> float | None:
    if name not in columns:
        return None
    value = columns[name][row]
    return float(value) if value is not None else None


def _finite(value: float | None, fallback: float) -> float:
    return value if value is not None and math.isfinite(value) else fallback
