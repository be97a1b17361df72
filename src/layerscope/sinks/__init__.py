"""Where records go: the ``Sink`` protocol and the sinks that ship with layerscope.

``NullSink`` drops everything, ``MemorySink`` keeps everything in memory. ``TensorBoard``,
``WandB`` and ``MLflow`` send statistics, histograms, scalars and (the last two) alerts to
those trackers under the same names; ``WandB`` and ``MLflow`` from rank 0 only. They need
``layerscope[tensorboard]``, ``[wandb]`` or ``[mlflow]``, and import it when they start,
never at ``import layerscope``. The Parquet
run store, ``layerscope.store.ParquetStore``, is a sink too. A sink's ``write`` gets
``Records``, whose ``stats`` are ``StatsRows``.
"""

from layerscope.model import StatsRows, join_columns
from layerscope.sinks._base import FanOut, NullSink, Records, RunInfo, RunSummary, Sink
from layerscope.sinks._memory import MemorySink
from layerscope.sinks._mlflow import MLflow
from layerscope.sinks._tags import ALERT_COLUMNS, DEFAULT_STATS
from layerscope.sinks._tensorboard import TensorBoard
from layerscope.sinks._wandb import WandB

__all__ = [
    "ALERT_COLUMNS",
    "DEFAULT_STATS",
    "FanOut",
    "MLflow",
    "MemorySink",
    "NullSink",
    "Records",
    "RunInfo",
    "RunSummary",
    "Sink",
    "StatsRows",
    "TensorBoard",
    "WandB",
    "join_columns",
]
