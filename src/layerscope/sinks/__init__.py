"""Where records go: the ``Sink`` protocol and the sinks that ship with layerscope.

``NullSink`` drops everything, ``MemorySink`` keeps everything in memory, ``TensorBoard``
writes scalars and histograms for TensorBoard (needs ``layerscope[tensorboard]``). The Parquet
run store, ``layerscope.store.ParquetStore``, is a sink too. A sink's ``write`` gets
``Records``, whose ``stats`` are ``StatsRows``.
"""

from layerscope.sinks._base import FanOut, NullSink, Records, RunInfo, RunSummary, Sink
from layerscope.sinks._memory import MemorySink
from layerscope.sinks._rows import StatsRows
from layerscope.sinks._tensorboard import TensorBoard

__all__ = [
    "FanOut",
    "MemorySink",
    "NullSink",
    "Records",
    "RunInfo",
    "RunSummary",
    "Sink",
    "StatsRows",
    "TensorBoard",
]
