"""WandB: statistics, histograms, scalars and alerts in a Weights & Biases run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from layerscope._imports import require
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.sinks._tags import (
    ALERT_COLUMNS,
    DEFAULT_STATS,
    attention_values,
    chosen_stats,
    row_bins,
    tagged_rows,
    value_bounds,
)

#: The x-axis of every chart this sink makes: the training step.
STEP = "layerscope/step"
#: How many alerts the run has had so far, logged at each step that had new ones.
ALERT_COUNT = "layerscope/alert_count"
#: The table of every alert, logged when the sink closes.
ALERTS = "layerscope/alerts"
_MAX_BINS = 512  # the most bins a wandb.Histogram takes


class WandB:
    """Logs each recorded tensor's statistics and histogram to a Weights & Biases run.

    Keys read ``{phase}/{kind}/{module}/{tensor}/{stat}`` as TensorBoard tags do, histograms
    ``{phase}/{kind}/{module}/{tensor}/hist``; scalars from ``scope.step(**scalars)`` keep
    their names. A log2 histogram is a histogram of the values over its occupied power-of-two
    bins of each sign and one bin of zeros and subnormals between them (``signed_histograms``:
    the recorder counts it split by sign for this sink); a run recorded without the split and
    replayed by ``layerscope export`` shows ``|x|``. Inf and NaN are in ``inf_count`` and
    ``nan_count``. Every chart's x-axis is the
    training step, ``layerscope/step``: the sink logs it with each row instead of passing
    ``step=``, because W&B drops a ``step=`` lower than one already logged, and rows of a
    step can reach the sink after later steps' (an evaluation's, or another logger's on a
    shared run). Alerts are counted in ``layerscope/alert_count`` as they come and logged as
    one table, ``layerscope/alerts``, when the sink closes.

    Only rank 0 logs. If a W&B run is active (``wandb.run``) when ``watch()`` starts, the
    sink logs to it and leaves it open; otherwise it starts a run of its own (named as the
    layerscope run, its config the watch configuration) and finishes it at close. Each flush
    costs one ``run.log`` per step it holds. Needs ``layerscope[wandb]``.

    On a run of your own, log as Lightning's and the Hugging Face Trainer's W&B loggers do,
    with a step metric of your own rather than ``step=``: each of the sink's rows is a W&B
    row, and W&B drops a later ``log(step=s)`` whose ``s`` is below its count of rows.

    Args:
        project: the W&B project of a run the sink starts (None: W&B's default).
        stats: which statistics become charts.
        histograms: whether to log histograms.
        prefix: put before every key the sink logs (not ``layerscope/step``), such as
            ``"layerscope/"`` on a run whose own keys would collide with the scalars' names.
        init: more arguments for ``wandb.init`` of a run the sink starts (``entity``,
            ``tags``, ``mode``, ``dir``, ...).

    Example::

        scope = layerscope.watch(model, sinks=[layerscope.sinks.WandB(project="exp")])
    """

    def __init__(
        self,
        *,
        project: str | None = None,
        stats: str | Sequence[str] = DEFAULT_STATS,
        histograms: bool = True,
        prefix: str = "",
        init: Mapping[str, Any] | None = None,
    ) -> None:
        self.project = project
        self.stats = chosen_stats(stats)
        self.histograms = histograms
        self.prefix = prefix
        self.init = dict(init or {})
        self.run: Any = None  # the W&B run written to, while open
        self.run_id: str | None = None  # its id, also after close
        self._wandb: Any = None
        self._info: RunInfo | None = None
        self._off = False  # a rank other than 0: writes nothing
        self._rank_checked = False
        self._owned = False  # started here, so finished here
        self._defined: set[str] = set()  # keys and key patterns whose x-axis is set
        self._alerts: list[list[Any]] = []

    @property
    def signed_histograms(self) -> bool:
        """Whether the recorder should count the log2 histogram split by sign: with histograms.

        The same on every rank, though only rank 0 logs: ranks merged by ``ranks="merge"``
        count alike.
        """
        return self.histograms

    def start(self, info: RunInfo) -> None:
        """Attach to the active W&B run or start one (imports wandb here, on rank 0 only).

        The run is opened here, so that a W&B that cannot start fails ``watch()``. A rank not
        known yet (``watch()`` before ``init_process_group``, with no launcher's ``RANK``) is
        not fixed here, which would fix it for the whole scope: the first write asks for it,
        and a rank other than 0 then logs nothing and only finishes the run it started.
        """
        known = info.place.peek()
        if known is not None and known[0] != 0:
            self._off = True
            return
        self._wandb = require("wandb", "wandb")
        self._info = info
        self._rank_checked = known is not None
        self._open(info)

    def _open(self, info: RunInfo) -> None:
        wandb = self._wandb
        run = wandb.run
        if run is None:
            options: dict[str, Any] = {"name": info.name, "config": {"layerscope": info.config}}
            if self.project is not None:
                options["project"] = self.project
            run = wandb.init(**{**options, **self.init})
            self._owned = True
        run.define_metric(STEP)
        self.run, self.run_id = run, str(run.id)

    def _ready(self) -> bool:
        """Whether this rank writes: rank 0, asked for at the first write if not known."""
        if self._off or self.run is None or self._info is None:
            return False
        if not self._rank_checked:
            self._rank_checked = True
            self._off = self._info.rank != 0
        return not self._off

    def write(self, records: Records) -> None:
        """Log the flush: one ``run.log`` per step, holding every key of that step."""
        if not self._ready():
            return
        prefix = self.prefix
        by_step: dict[int, dict[str, Any]] = {}
        for step, name, value in (*records.scalars, *attention_values(records.attention)):
            by_step.setdefault(step, {})[prefix + name] = value
        if records.stats is not None and len(records.stats):
            self._add_stats(records, by_step)
        if records.alerts:
            for alert in records.alerts:
                self._alerts.append([getattr(alert, column) for column in ALERT_COLUMNS])
                by_step.setdefault(alert.step, {})[prefix + ALERT_COUNT] = len(self._alerts)
        run = self.run
        for step in sorted(by_step):
            row = by_step[step]
            self._define(row)
            row[STEP] = step
            run.log(row)

    def _add_stats(self, records: Records, by_step: dict[int, dict[str, Any]]) -> None:
        chunk = records.stats
        assert chunk is not None  # checked by write
        edges = self._info.histogram_edges if self._info is not None else None
        histograms = self.histograms and edges is not None
        bounds = value_bounds(chunk, self._info) if histograms else None
        histogram = self._wandb.Histogram
        prefix = self.prefix
        for row in tagged_rows(chunk, self.stats, histograms):
            data = by_step.setdefault(row.step, {})
            for name, value in row.values.items():
                data[f"{prefix}{row.tag}/{name}"] = value
            if row.counts is None or bounds is None:
                continue
            low, high = bounds
            bins = row_bins(row, edges, low[row.index], high[row.index])
            if bins is not None:
                data[f"{prefix}{row.tag}/hist"] = histogram(np_histogram=_at_most(*bins))

    def _define(self, row: Mapping[str, Any]) -> None:
        """Make the training step the x-axis of the keys in ``row`` not seen before.

        One pattern per phase and kind of tensor (``train/grad/*``) rather than one per key:
        a model of a thousand layers would otherwise define tens of thousands of metrics.
        """
        for key in row:
            name = key[len(self.prefix) :]
            parts = name.split("/")
            pattern = f"{self.prefix}{parts[0]}/{parts[1]}/*" if len(parts) > 4 else key
            if pattern not in self._defined:
                self._defined.add(pattern)
                self.run.define_metric(pattern, step_metric=STEP)

    def flush(self) -> None:
        """Nothing to do: W&B sends what was logged in the background."""

    def close(self, summary: RunSummary) -> None:
        """Log the alerts table; finish the run if the sink started it."""
        if self.run is None:
            return
        try:
            if self._alerts:
                table = self._wandb.Table(columns=list(ALERT_COLUMNS), data=self._alerts)
                self.run.log({self.prefix + ALERTS: table})
        finally:
            if self._owned:
                self.run.finish(exit_code=0 if summary.status == "finished" else 1)
            self.run = None


def _at_most(counts: list[int], edges: list[float]) -> tuple[list[int], list[float]]:
    """Neighbouring bins merged in pairs until there are few enough for a W&B histogram."""
    while len(counts) > _MAX_BINS:
        pairs = [
            counts[i] + (counts[i + 1] if i + 1 < len(counts) else 0)
            for i in range(0, len(counts), 2)
        ]
        edges = edges[::2] if len(counts) % 2 == 0 else [*edges[::2], edges[-1]]
        counts = pairs
    return counts, edges
