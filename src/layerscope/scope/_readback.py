"""What a scope recorded, read back: frames, figures, whole tensors, modules and costs.

``frame()``, ``plot``, the whole tensors it kept, the module tree and call order, and what
watching cost so far.
Frames and figures come from the run's store where the scope writes one, else from its
in-memory sink. Each read first has the writer write every step so far, so that it shows all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope._config import WatchConfig
from layerscope._errors import FailureCounter
from layerscope._imports import require
from layerscope.distributed import ProcessRank
from layerscope.model import alert_counts, html_table, unreadable
from layerscope.scope._frames import TABLES, memory_frame, stats_columns, stored_frame
from layerscope.scope._run_info import run_info
from layerscope.scope._whole_tensors import WholeTensors
from layerscope.sinks import MemorySink, RunInfo
from layerscope.tensors import SavedCapture

if TYPE_CHECKING:
    import pandas
    from torch import nn

    from layerscope.hooks import CostMeter, LayerHooks, StepClock
    from layerscope.model import CallEvent, ModuleInfo
    from layerscope.plots import RunPlots
    from layerscope.store import ParquetStore
    from layerscope.tensors import TensorsSpec


class RecordedReads:
    """The reading half of ``Scope``: what it recorded and what it cost, as it stands now."""

    config: WatchConfig
    _store: ParquetStore | None
    _memory: MemorySink | None
    _place: ProcessRank
    _whole: WholeTensors | None
    _tensors_spec: TensorsSpec | None
    _modules: list[ModuleInfo]
    _meter: CostMeter
    _root: nn.Module
    _started: float
    _failures: FailureCounter
    _layers: LayerHooks
    _clock: StepClock
    _closed: bool

    @property
    def cost_seconds(self) -> float:
        """Seconds layerscope has spent on the training thread so far.

        That is its hooks, its reading of parameters and the start of its flushes. Work on the
        writer thread is not counted here; on CUDA the hooks only launch kernels, so this is
        their host-side cost. ``run.json`` keeps the total as ``cost_seconds``, and the CPU time
        of the writer thread and of the store's file writes as ``writer_seconds``.
        """
        return self._meter.seconds

    @property
    def run_path(self) -> str | None:
        """The run's directory (a path or URL) where it is written; None for one in memory."""
        return None if self._store is None else self._store.path

    @property
    def failures(self) -> int:
        """How many times monitoring failed and was skipped (the first one also warned)."""
        return self._failures.count

    @property
    def modules(self) -> list[ModuleInfo]:
        """The module tree: every module's type, parameter shapes and counts, and children."""
        return list(self._modules)

    @property
    def calls(self) -> list[CallEvent]:
        """Enter and exit order of the watched modules' forwards in every recorded step.

        Each recorded step's first training pass, each event with its step (a model whose
        branches change between steps shows each step's own). A compiled model's hooks
        cannot come and go: there only its first recorded step's order is logged.
        """
        return self._layers.calls

    def _catch_up(self) -> None:
        """Write every step so far before a read; ``Scope`` says how."""
        raise NotImplementedError

    def _state(self) -> str:
        """``"open, step 5"`` or ``"closed"``."""
        return "closed" if self._closed else f"open, step {self._clock.step}"

    def _repr_html_(self) -> str:
        """A notebook's view: where it writes, its state, layers, kinds and alerts so far."""
        where = self._store.path if self._store is not None else "in memory (run=None)"
        watched = sum(info.watched for info in self._modules)
        fields: list[tuple[str, object]] = [
            ("run", where),
            ("state", self._state()),
            ("layers watched", watched),
            ("kinds", ", ".join(sorted(str(kind) for kind in self.config.kinds))),
        ]
        try:
            fields.append(("alerts so far", alert_counts(self.frame("alerts")["severity"])))
        except Exception as error:  # a view never raises
            fields.append(("alerts so far", unreadable(error)))
        return html_table(f"layerscope scope of {type(self._root).__name__}", fields)

    def _run_info(self) -> RunInfo:
        """What the sinks are told at the start of this scope's run."""
        return run_info(
            self.config,
            self._tensors_spec,
            self._store,
            self._place,
            self._modules,
            self._meter,
            self._root,
            self._started,
        )

    def frame(self, table: str = "stats") -> pandas.DataFrame:
        """What was recorded, as a pandas DataFrame (needs ``layerscope[dataframe]``).

        Args:
            table: ``"stats"`` (one row per step, phase, rank, module, kind, tensor and call),
                ``"scalars"`` (step, name, value), ``"alerts"`` (the health rules' findings)
                ``"attention"`` (step, phase, rank, module, call, head, keys, entropy_mean,
                entropy_min, entropy_frac, max_prob: one row per head of each attention call,
                with ``watch(attention=True)``) or ``"calls"`` (step, seq, event, module,
                call: the call order of every recorded step, as ``calls``).

        Returns:
            A new DataFrame; later steps do not change it.
        """
        require("pandas", "dataframe")
        if table not in TABLES:
            raise ValueError(f"table: expected one of {list(TABLES)}, got {table!r}")
        self._catch_up()
        stats = stats_columns(self.config.stats, self.config.histogram is not None)
        if self._store is not None:
            return stored_frame(self._store.path, table, stats, self._place.rank)
        assert self._memory is not None  # a scope without a store keeps its rows in memory
        return memory_frame(self._memory, table, stats)

    @property
    def plot(self) -> RunPlots:
        """Matplotlib figures of what was recorded so far: ``scope.plot.stats()``, ...

        The same figures as ``layerscope.load(path).plot``, of the run this scope writes, or
        of its records in memory if it writes none (needs ``layerscope[plot]``). Each access
        shows the steps recorded until then.
        """
        from layerscope.plots import RunPlots
        from layerscope.scope._memory_run import MemoryRun
        from layerscope.store import load

        self._catch_up()
        if self._memory is not None:
            return RunPlots(MemoryRun(self._memory))
        assert self._store is not None  # a scope keeps its rows in memory or in a store
        try:
            return RunPlots(load(self._store.path))
        except FileNotFoundError:  # nothing written yet: a rank's files come with its rows
            return RunPlots(
                MemoryRun(
                    MemorySink(),
                    self._run_info(),
                )
            )

    @property
    def tensors(self) -> SavedCapture:
        """The whole tensors kept so far (``tensors=``), as ``layerscope.load_capture`` reads them.

        Read back from the run's files, or from memory for a run without a directory; each
        record's ``step`` is the scope's. Empty without ``tensors=``.
        """
        if self._whole is None:
            return SavedCapture([], {"tensors": None})
        return self._whole.records()  # it waits for the outlet

    @property
    def tensors_dropped(self) -> int:
        """Whole tensors not kept: past ``max_bytes``, or while earlier steps' were written."""
        return 0 if self._whole is None else self._whole.dropped

    @property
    def on_tensor_dropped(self) -> int:
        """Tensors ``on_tensor`` never finished with.

        Its workers were busy when they came, still had them when the scope closed (it waits
        10 s for them), or were turned off.
        """
        workers = None if self._whole is None else self._whole.workers
        return 0 if workers is None else workers.dropped + workers.abandoned
