"""The writer thread: a flush's batches become rows, are checked, and are stored.

Receives ``Batch``es from the recorder through a bounded queue (``Pipeline.submit``), off the
training thread. It merges the readings of one tensor and step (``merge_batches``), finalises
partials into statistics (``StatsRows``), adds the sentinel's rows, merges rows across ranks
where ``ranks="merge"``, runs the health rules (``layerscope.health``), and hands rows,
scalars and alerts on to the sinks (``layerscope.sinks``: the run's Parquet store,
TensorBoard, W&B, MLflow, memory).
"""

from layerscope.writer._pipeline import Pipeline
from layerscope.writer._rank_merge import rank_merge_for

__all__ = [
    "Pipeline",
    "rank_merge_for",
]
