"""MLflow: statistics, scalars and alerts as metrics of an MLflow run, histograms as artifacts."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections.abc import Sequence
from typing import Any

from layerscope._imports import require
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.sinks._tags import (
    ALERT_COLUMNS,
    DEFAULT_STATS,
    ROOT,
    attention_values,
    chosen_stats,
    row_bins,
    tagged_rows,
    value_bounds,
)

#: How many alerts the run has had so far, logged at each step that had new ones.
ALERT_COUNT = "layerscope/alert_count"
#: Artifacts: every alert so far, and one file of histograms per flush.
ALERTS_FILE = "layerscope/alerts.json"
HISTOGRAMS_FOLDER = "layerscope/histograms"
_BATCH = 1000  # the most metrics one log_batch takes
# Tracking URI schemes MLflow opens with SQLAlchemy.
_DATABASES = frozenset(("sqlite", "postgresql", "mysql", "mssql"))
# What MLflow allows in a metric name on every platform; anything else becomes "_".
_NOT_ALLOWED = re.compile(r"[^/\w.\- ]")


def metric_name(key: str) -> str:
    """``key`` as MLflow allows a metric name: ``<root>`` as ``_root_``, ``out#1`` as ``out_1``.

    Examples:
        >>> metric_name("train/activation/<root>/out#1/mean")
        'train/activation/_root_/out_1/mean'
    """
    return _NOT_ALLOWED.sub("_", key.replace(ROOT, "_root_"))


def _check_store(uri: str) -> None:
    """An ImportError saying what to install where ``uri`` is a database MLflow cannot open.

    MLflow 3 logs to ``sqlite:///mlflow.db`` by default; its database stores come with the
    full ``mlflow`` (SQLAlchemy), not with ``mlflow-skinny``, which refuses them with a
    message about the model registry.
    """
    scheme = uri.partition(":")[0]
    if scheme in _DATABASES and importlib.util.find_spec("sqlalchemy") is None:
        raise ImportError(
            f"MLflow's store {uri} needs the full mlflow (SQLAlchemy): pip install "
            "'layerscope[mlflow]' brings it; with mlflow-skinny, give tracking_uri= a "
            "tracking server"
        )


class MLflow:
    """Logs each recorded tensor's statistics as metrics of an MLflow run.

    Metric names read ``{phase}/{kind}/{module}/{tensor}/{stat}`` as TensorBoard tags do, with
    the characters MLflow refuses replaced (see ``metric_name``): the root module is
    ``_root_`` and a module's second call in a step ``out_1``. Scalars from
    ``scope.step(**scalars)`` keep their names. Each flush is one ``log_batch`` per thousand
    metrics, every metric at its training step.

    MLflow has no histograms, so each flush's histograms go to one JSON artifact,
    ``layerscope/histograms/steps-{first}-{last}.json``: a list of ``{"step", "name",
    "counts", "edges"}`` over the occupied bins, for a notebook to plot. A log2 histogram's
    are powers of two of each sign with one bin of zeros and subnormals between them
    (``signed_histograms``: the recorder counts it split by sign for this sink), or of
    ``|x|`` in a run replayed by ``layerscope export`` that was recorded without the split.
    That is one artifact upload per flush; pass ``histograms=False`` to leave them to the
    layerscope run, which keeps them all. Alerts are counted in the metric
    ``layerscope/alert_count`` as they come, and every alert so far is in the artifact
    ``layerscope/alerts.json``, rewritten at each flush that brings new ones so that a crash
    loses none.

    Only rank 0 logs. If an MLflow run is active (``mlflow.active_run()``) when ``watch()``
    starts, the sink logs to it and leaves it open; otherwise it starts a run of its own,
    named as the layerscope run, and ends it at close. Needs ``layerscope[mlflow]``, the full
    ``mlflow``, whose default store is ``sqlite:///mlflow.db`` in the working folder (the
    lighter ``mlflow-skinny`` logs to a tracking server, or to a local folder with
    ``MLFLOW_ALLOW_FILE_STORE=true``; it cannot open a database store).

    Args:
        tracking_uri: where a run the sink starts goes (None: MLflow's default, or
            ``MLFLOW_TRACKING_URI``). An active run is written where it lives.
        experiment: the experiment of a run the sink starts, created if missing (None:
            MLflow's default experiment, or ``MLFLOW_EXPERIMENT_NAME``).
        stats: which statistics become metrics.
        histograms: whether to write the histograms artifact of each flush.

    Example::

        scope = layerscope.watch(model, sinks=[layerscope.sinks.MLflow(experiment="exp")])
    """

    def __init__(
        self,
        *,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        stats: str | Sequence[str] = DEFAULT_STATS,
        histograms: bool = True,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.stats = chosen_stats(stats)
        self.histograms = histograms
        self.run_id: str | None = None  # the MLflow run written to, once open
        self._client: Any = None
        self._metric: Any = None  # mlflow.entities.Metric
        self._info: RunInfo | None = None
        self._off = False  # a rank other than 0: writes nothing
        self._rank_checked = False
        self._owned = False  # started here, so ended here
        self._alerts: list[dict[str, Any]] = []

    @property
    def signed_histograms(self) -> bool:
        """Whether the recorder should count the log2 histogram split by sign: with histograms."""
        return self.histograms

    def start(self, info: RunInfo) -> None:
        """Find the active MLflow run, or start one (imports mlflow here, on rank 0 only).

        The run is found or started here, on the training thread: MLflow keeps the active
        run per thread, and a tracking store that cannot work fails ``watch()``. A rank not
        known yet (``watch()`` before ``init_process_group``, with no launcher's ``RANK``)
        is not fixed here, which would fix it for the whole scope: the first write asks for
        it, and a rank other than 0 then logs nothing and only ends the run it started.
        """
        known = info.place.peek()
        if known is not None and known[0] != 0:
            self._off = True
            return
        mlflow = require("mlflow", "mlflow")
        self._metric = require("mlflow.entities", "mlflow").Metric
        self._info = info
        self._rank_checked = known is not None
        from mlflow.tracking import MlflowClient

        active = mlflow.active_run()
        if active is not None:  # written where it lives, whatever tracking_uri says
            self._client = MlflowClient(mlflow.get_tracking_uri())
            self.run_id = active.info.run_id
        else:
            _check_store(self.tracking_uri or mlflow.get_tracking_uri())
            self._client = client = MlflowClient(self.tracking_uri)
            run = client.create_run(
                self._experiment_id(client), run_name=info.name, tags={"layerscope.id": info.id}
            )
            self.run_id, self._owned = run.info.run_id, True
        self._client.log_dict(self.run_id, info.config, "layerscope/config.json")

    def _experiment_id(self, client: Any) -> str:
        """The experiment named ``experiment``, created if missing; else MLflow's choice."""
        if self.experiment is None:
            return _default_experiment()
        found = client.get_experiment_by_name(self.experiment)
        return str(found.experiment_id if found else client.create_experiment(self.experiment))

    def _ready(self) -> bool:
        """Whether this rank writes: rank 0, asked for at the first write if not known."""
        if self._off or self.run_id is None or self._info is None:
            return False
        if not self._rank_checked:
            self._rank_checked = True
            self._off = self._info.rank != 0
        return not self._off

    def write(self, records: Records) -> None:
        """Log the flush's metrics in batches, its histograms and new alerts as artifacts."""
        if not self._ready():
            return
        now = int(time.time() * 1000)
        metric = self._metric
        metrics = [
            metric(metric_name(name), float(value), now, int(step))
            for step, name, value in (*records.scalars, *attention_values(records.attention))
        ]
        histograms: list[dict[str, Any]] = []
        if records.stats is not None and len(records.stats):
            self._add_stats(records, metrics, histograms, now)
        for alert in records.alerts:
            self._alerts.append({column: getattr(alert, column) for column in ALERT_COLUMNS})
            metrics.append(metric(ALERT_COUNT, float(len(self._alerts)), now, int(alert.step)))
        client, run_id = self._client, self.run_id
        for start in range(0, len(metrics), _BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + _BATCH])
        if histograms:
            first, last = histograms[0]["step"], histograms[-1]["step"]
            steps = f"steps-{first:08d}-{last:08d}"
            client.log_dict(run_id, histograms, f"{HISTOGRAMS_FOLDER}/{steps}.json")
        if records.alerts:
            client.log_text(run_id, json.dumps(self._alerts, indent=1), ALERTS_FILE)

    def _add_stats(
        self,
        records: Records,
        metrics: list[Any],
        histograms: list[dict[str, Any]],
        now: int,
    ) -> None:
        chunk = records.stats
        assert chunk is not None  # checked by write
        edges = self._info.histogram_edges if self._info is not None else None
        keep_histograms = self.histograms and edges is not None
        low, high = value_bounds(chunk, self._info) if keep_histograms else ([], [])
        metric = self._metric
        for row in tagged_rows(chunk, self.stats, keep_histograms):
            name = metric_name(row.tag)
            for stat, value in row.values.items():
                metrics.append(metric(f"{name}/{stat}", float(value), now, row.step))
            if row.counts is None:
                continue
            bins = row_bins(row, edges, low[row.index], high[row.index])
            if bins is not None:
                counts, bounds = bins
                histograms.append({"step": row.step, "name": f"{name}/hist", "counts": counts})
                histograms[-1]["edges"] = bounds
        histograms.sort(key=lambda entry: int(entry["step"]))

    def flush(self) -> None:
        """Nothing to do: every write is sent as it is made."""

    def close(self, summary: RunSummary) -> None:
        """End the run if the sink started it, as finished or failed."""
        if self.run_id is None or not self._owned:
            return
        status = "FINISHED" if summary.status == "finished" else "FAILED"
        self._client.set_terminated(self.run_id, status)


def _default_experiment() -> str:
    """The experiment ``mlflow.start_run()`` would use: ``set_experiment``'s, the environment's.

    MLflow keeps it privately; where it no longer does, its default experiment, ``"0"``.
    """
    from mlflow.tracking import fluent

    chosen = getattr(fluent, "_get_experiment_id", None)
    found = chosen() if chosen is not None else None
    return str(found) if found is not None else "0"
