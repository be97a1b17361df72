"""What a scope tells its sinks as its run starts (``RunInfo``) and as it ends (``RunSummary``)."""

from __future__ import annotations

import time
import uuid
import weakref
from collections.abc import Callable

from torch import nn

from layerscope._config import WatchConfig
from layerscope._errors import FailureCounter
from layerscope.distributed import ProcessRank
from layerscope.hooks import CostMeter
from layerscope.model import ModuleInfo, device_type
from layerscope.sinks import RunInfo, RunSummary
from layerscope.stats import kernel_name
from layerscope.store import ParquetStore
from layerscope.tensors import TensorsSpec


def run_info(
    config: WatchConfig,
    tensors: TensorsSpec | None,
    store: ParquetStore | None,
    place: ProcessRank,
    modules: list[ModuleInfo],
    meter: CostMeter,
    root: nn.Module,
    started: float,
) -> RunInfo:
    """The ``RunInfo`` of a scope's run; a run without a store is named by its start time."""
    name = store.name if store is not None else f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    return RunInfo(
        id=uuid.uuid4().hex,
        name=name,
        started=started,
        place=place,
        config={**config.to_dict(), "tensors": None if tensors is None else tensors.to_dict()},
        modules=modules,
        histogram_edges=config.histogram_edges(),
        progress=_progress_of(meter, weakref.ref(root)),
    )


def run_summary(
    status: str,
    steps: int,
    failures: FailureCounter,
    meter: CostMeter,
    root: nn.Module,
    recorded_rows: int,
    dropped_rows: int,
    dropped_scalars: int,
    writer_seconds: float,
) -> RunSummary:
    """The ``RunSummary`` of a scope's run as it closes: ``status``, counts and costs."""
    return RunSummary(
        status=status,
        ended=time.time(),
        steps=steps,
        recorded_rows=recorded_rows,
        dropped_rows=dropped_rows,
        dropped_scalars=dropped_scalars,
        failures=failures.count,
        cost_seconds=meter.seconds,
        writer_seconds=writer_seconds,
        kernel=kernel_name(device_type(root)),
    )


def _progress_of(meter: CostMeter, root: weakref.ref[nn.Module]) -> Callable[[], tuple[float, str]]:
    """Seconds on the training thread so far and the kernel, asked at each flush.

    Holds neither the scope nor the model: an open scope must not pin them (see _lifecycle).
    """

    def progress() -> tuple[float, str]:
        model = root()
        return meter.seconds, "" if model is None else kernel_name(device_type(model))

    return progress
