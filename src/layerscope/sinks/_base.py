"""The sink protocol: where finalised statistics go, and the do-nothing and fan-out sinks.

A sink gets ``start(info)`` once, ``write(records)`` for every finished flush, ``flush()`` at
the store's cadence and whenever a reader asks for everything so far, and ``close(summary)``
at the end. All but ``start`` run on layerscope's writer thread, never in the training loop's
hot path; a sink imports its heavy packages in ``start``. A sink whose ``signed_histograms``
is true (TensorBoard, W&B and MLflow with histograms) has the log2 histogram counted split by
sign: its rows' ``negative`` holds the negative half.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from layerscope.distributed import ProcessRank
from layerscope.health import Alert
from layerscope.model import AttentionRow, CallEvent, ModuleInfo, StatsRows


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a sink knows of the run when it starts."""

    id: str
    name: str
    started: float  # seconds since the epoch
    place: ProcessRank  # rank and world size, fixed when first asked for
    config: dict[str, Any]
    modules: list[ModuleInfo]
    histogram_edges: list[float] | None  # lower edge of each histogram slot, for readers
    # So far: layerscope's seconds on the training thread and the statistics kernel, for a
    # sink that reports while the run goes on (run.json at each flush, read after a kill).
    progress: Callable[[], tuple[float, str]] | None = None

    @property
    def rank(self) -> int:
        """This process's rank; asking fixes it, so ask when it is first needed, not before."""
        return self.place.rank


@dataclass(frozen=True, slots=True)
class RunSummary:
    """How the run ended, for ``close``."""

    status: str  # "finished" or "failed"
    ended: float
    steps: int
    recorded_rows: int  # rows of the stats table
    dropped_rows: int  # rows of the stats table lost on the way (a full queue, a failure)
    failures: int
    cost_seconds: float = 0.0  # layerscope's time on the training thread
    writer_seconds: float = 0.0  # CPU time of its writer thread, off the training thread
    dropped_scalars: int = 0  # scalars lost on the way
    # Which kernel computed the statistics on the model's device: "native-avx2" (the C
    # kernel's AVX2 copy), "compiled", ...: the figures' speed depends on it.
    kernel: str = ""


@dataclass(slots=True)
class Records:
    """Finalised rows of one flush: statistics, scalars, alerts, attention and call orders.

    ``calls`` holds a recorded step's enter and exit events where its order differs from the
    one sent before it, and one event ``same`` (module "") for a step that repeats it.
    """

    stats: StatsRows | None = None
    scalars: list[tuple[int, str, float]] = field(default_factory=list)
    calls: list[CallEvent] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)  # the health rules' findings
    attention: list[AttentionRow] = field(default_factory=list)  # per head of attention calls


@runtime_checkable
class Sink(Protocol):
    """Where layerscope's records go."""

    def start(self, info: RunInfo) -> None:
        """Prepare for the run; raise here for a destination that cannot work at all."""

    def write(self, records: Records) -> None:
        """Take the rows of one flush."""

    def flush(self) -> None:
        """Make everything written so far durable or visible."""

    def close(self, summary: RunSummary) -> None:
        """Finish the run."""


class NullSink:
    """A sink that drops everything: for ranks that do not log, and as a default."""

    def start(self, info: RunInfo) -> None:
        """Nothing to prepare."""

    def write(self, records: Records) -> None:
        """Drop the records."""

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self, summary: RunSummary) -> None:
        """Nothing to close."""


class FanOut:
    """Several sinks as one, so the writer never asks which ones exist.

    Each sink is called even when one before it raised: a full disk under the store must not
    also cost the other sinks their rows. The first error is raised once all have been called.

    Args:
        sinks: the sinks, the one that must start (the run's store) last.
        optional: how many of the first sinks (the user's trackers) may fail to start: such a
            sink is told to ``fail`` and left out, and the others start without it. A sink
            whose package is missing (ImportError) fails the start all the same.
        fail: what is told of a sink that failed to start: where, and the error.
    """

    def __init__(
        self,
        sinks: Sequence[Sink],
        optional: int = 0,
        fail: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.sinks = list(sinks)
        self._optional = optional
        self._fail = fail

    def start(self, info: RunInfo) -> None:
        """Start every sink; if one that must start fails, those started are closed again.

        One of the ``optional`` sinks that fails to start is left out, and ``fail`` told.
        """
        started: list[Sink] = []
        try:
            for index, sink in enumerate(self.sinks):
                try:
                    sink.start(info)
                except Exception as error:
                    # A missing package is the user's to install, said before training.
                    required = index >= self._optional or isinstance(error, ImportError)
                    if required or self._fail is None:
                        raise
                    self._fail(f"starting the sink {type(sink).__name__}", error)
                    continue
                started.append(sink)
            self.sinks = started
        except Exception:
            summary = RunSummary("failed", time.time(), 0, 0, 0, 1)
            for sink in started:
                with contextlib.suppress(Exception):  # the first error is the one to raise
                    sink.close(summary)
            raise
        finally:
            self._fail = None  # told of start only: holding it would pin its owner

    @property
    def signed_histograms(self) -> bool:
        """Whether a sink draws histograms of signed values (its ``signed_histograms``)."""
        return any(getattr(sink, "signed_histograms", False) for sink in self.sinks)

    def write(self, records: Records) -> None:
        """Give the records to every sink."""
        self._each(lambda sink: sink.write(records))

    def flush(self) -> None:
        """Flush every sink."""
        self._each(lambda sink: sink.flush())

    def sync(self) -> None:
        """Wait for the sinks that write in the background (``sync``) to finish a flush."""
        self._each(lambda sink: getattr(sink, "sync", _nothing)())

    def close(self, summary: RunSummary) -> None:
        """Close every sink."""
        self._each(lambda sink: sink.close(summary))

    def _each(self, action: Callable[[Sink], object]) -> None:
        error: Exception | None = None
        for sink in self.sinks:
            try:
                action(sink)
            except Exception as raised:
                error = error or raised
        if error is not None:
            raise error


def _nothing() -> None:
    pass
