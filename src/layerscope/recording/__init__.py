"""Readings on their way to rows: from a hook's tensor to the batch the writer receives.

Receives tensors from the hooks (``Recorder.record``, ``record_group``, ``record_extremes``).
Each becomes a row of partials, computed on the tensor's device by ``layerscope.stats``'s
kernels and written into a device buffer (``DeviceRows``) with no host sync, and a reading:
integer columns naming its identity, step and place in the buffer (``Readings``). At a flush
the buffers come to the host in one copy, and readings and buffers go on to the writer thread
(``layerscope.writer``) as one ``Batch``.
"""

from layerscope.recording._batches import AttentionRef, Batch, Extreme, arrive
from layerscope.recording._buffer import Arrived
from layerscope.recording._readings import (
    BUFFER,
    FIELDS,
    FORM,
    IDENTITY,
    REPLACES,
    ROW,
    STEP,
    CustomRef,
    Grouping,
    group_readings,
)
from layerscope.recording._recorder import Recorder
from layerscope.recording._subjects import (
    BatchOutlet,
    GroupEntry,
    Owner,
    Target,
    counted_histogram,
)

__all__ = [
    "BUFFER",
    "FIELDS",
    "FORM",
    "IDENTITY",
    "REPLACES",
    "ROW",
    "STEP",
    "Arrived",
    "AttentionRef",
    "Batch",
    "BatchOutlet",
    "CustomRef",
    "Extreme",
    "GroupEntry",
    "Grouping",
    "Owner",
    "Recorder",
    "Target",
    "arrive",
    "counted_histogram",
    "group_readings",
]
