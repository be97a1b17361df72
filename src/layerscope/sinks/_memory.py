"""MemorySink: keeps every record in memory; backs ``scope.frame()`` for runs without a store."""

from __future__ import annotations

from layerscope.health import Alert
from layerscope.model import AttentionRow, CallEvent, StatsRows
from layerscope.sinks._base import Records, RunInfo, RunSummary


class MemorySink:
    """Keeps every record in memory, in the order written.

    Examples:
        >>> import torch, layerscope
        >>> memory = layerscope.sinks.MemorySink()
        >>> model = torch.nn.Linear(2, 2)
        >>> with layerscope.watch(model, every=1, sinks=[memory]) as scope:
        ...     model(torch.ones(1, 2)).sum().backward()
        ...     scope.step(loss=0.5)
        >>> memory.scalars, memory.summary.status
        ([(0, 'loss', 0.5)], 'finished')
    """

    def __init__(self) -> None:
        self.info: RunInfo | None = None
        self.chunks: list[StatsRows] = []
        self.scalars: list[tuple[int, str, float]] = []
        self.calls: list[CallEvent] = []
        self.alerts: list[Alert] = []
        self.attention: list[AttentionRow] = []
        self.summary: RunSummary | None = None

    def start(self, info: RunInfo) -> None:
        """Remember the run."""
        self.info = info

    def write(self, records: Records) -> None:
        """Keep the records."""
        if records.stats is not None and len(records.stats):
            self.chunks.append(records.stats)
        self.scalars.extend(records.scalars)
        self.calls.extend(records.calls)
        self.alerts.extend(records.alerts)
        self.attention.extend(records.attention)

    def flush(self) -> None:
        """Nothing to flush: records are visible as soon as written."""

    def close(self, summary: RunSummary) -> None:
        """Remember how the run ended."""
        self.summary = summary
