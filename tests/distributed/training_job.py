"""What the torchrun workers share: the process group, a tiny model and its data, a training
loop run under the collective log, reference statistics of what each rank holds, and results
written as JSON for the pytest side to check.

Workers import this module from their own folder (``python script.py`` puts it on the path).
"""

from __future__ import annotations

import json
import math
import os
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from collective_log import CollectiveLog, flight_recorder_entries
from torch import Tensor, nn

STEPS = 3
KINDS = ("activation", "grad", "weight", "weight_grad", "update")
# A collective one rank issues and the other does not would otherwise wait 30 minutes.
TIMEOUT = timedelta(seconds=20)


def start() -> tuple[int, int]:
    """Join the job's gloo process group; (rank, world size)."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    return dist.get_rank(), dist.get_world_size()


def mlp() -> nn.Sequential:
    """The same tiny model on every rank and in every run of a worker.

    The last layer has one output: FSDP2 gives rank 0 its single row and rank 1 empty shards
    of its weight and bias, the case where ranks take different branches.
    """
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3), nn.Tanh(), nn.Linear(3, 1))


def batches(rank: int) -> list[Tensor]:
    """Each rank its own data, the same in every run: local gradients differ between ranks."""
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(8, 4, generator=generator) for _ in range(STEPS)]


def local(tensor: Tensor) -> Tensor:
    """A DTensor's shard, taken here without layerscope's helper: the test's own reading."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def reference_stats(tensor: Tensor) -> dict[str, float]:
    """Statistics of a tensor as layerscope defines them, computed in float64 numpy."""
    values = tensor.detach().double().reshape(-1).numpy()
    nan = math.nan
    magnitude = np.abs(values)
    # Values fp8 would lose: e4m3 holds |x| in [2**-9, 448], e5m2 in [2**-16, 57344].
    counts = {
        "e4m3_over": int(np.count_nonzero(magnitude > 448.0)),
        "e4m3_under": int(np.count_nonzero((magnitude > 0) & (magnitude < 2.0**-9))),
        "e5m2_under": int(np.count_nonzero((magnitude > 0) & (magnitude < 2.0**-16))),
    }
    if values.size == 0:
        return {"numel": 0, "mean": nan, "std": nan, "min": nan, "max": nan, "l2": nan, **counts}
    return {
        "numel": int(values.size),
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if values.size > 1 else nan,
        "min": float(values.min()),
        "max": float(values.max()),
        "l2": float(np.sqrt((values * values).sum())),
        **counts,
    }


class Expected:
    """What each parameter's rows should hold, read by the test from the tensors themselves.

    ``before_step`` reads the gradients (all-reduced by DDP, reduce-scattered by FSDP2) and
    keeps the weights; ``after_step`` reads the weights and their updates.
    """

    def __init__(self, model: nn.Module) -> None:
        self.params = dict(model.named_parameters())
        self.rows: list[dict[str, Any]] = []
        self._before: dict[str, Tensor] = {}

    def before_step(self, step: int) -> None:
        for name, param in self.params.items():
            self._add(step, name, "weight_grad", local(param.grad))
            self._before[name] = local(param).detach().clone()

    def after_step(self, step: int) -> None:
        for name, param in self.params.items():
            after = local(param).detach()
            self._add(step, name, "weight", after)
            self._add(step, name, "update", after - self._before[name])

    def _add(self, step: int, name: str, kind: str, tensor: Tensor) -> None:
        module, _, tensor_name = name.rpartition(".")
        row = {"step": step, "module": module, "tensor": tensor_name, "kind": kind}
        self.rows.append(row | reference_stats(tensor))


def train(
    model: nn.Module,
    data: list[Tensor],
    run: str | None,
    expected: Expected | None = None,
) -> dict[str, Any]:
    """Train ``model`` one step per batch, watched by layerscope where ``run`` is given.

    The collective log is active from before ``watch()`` until after ``close()``.

    Returns:
        ``collectives`` (the log), ``flight_recorder`` (op and sizes of what the recorder saw
        on any thread in that time), ``failures`` (the scope's, None unwatched) and
        ``params`` (the local parameters after training).
    """
    import layerscope

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen_before = _last_record_id()
    failures = None
    with CollectiveLog() as log:
        scope = None
        if run is not None:
            scope = layerscope.watch(model, optimizer=optimizer, every=1, run=run, kinds=KINDS)
        for step, x in enumerate(data):
            model(x).square().mean().backward()
            if expected is not None:
                expected.before_step(step)
            optimizer.step()
            if expected is not None:
                expected.after_step(step)
            optimizer.zero_grad()
        if scope is not None:
            scope.close()
            failures = scope.failures
    recorded = [e for e in flight_recorder_entries() if e["record_id"] > seen_before]
    return {
        "collectives": log.calls,
        "flight_recorder": [[e["op"], e["sizes"], e["this_thread"]] for e in recorded],
        "failures": failures,
        "params": {name: local(p).detach().tolist() for name, p in model.named_parameters()},
    }


def _last_record_id() -> int:
    entries = flight_recorder_entries()
    return entries[-1]["record_id"] if entries else -1


def save_loaded_run(run_dir: str, path: str, ranks: str = "each") -> None:
    """Rank 0, once every rank has closed its scope: what ``layerscope.load`` reads, as JSON."""
    import layerscope

    run = layerscope.load(run_dir, ranks=ranks)
    columns = ["step", "phase", "rank", "module", "kind", "tensor", "shard", "shape", "numel"]
    columns += ["mean", "std", "min", "max", "l2", "e4m3_over", "e4m3_under", "e5m2_under", "hist"]
    stats = run.stats.reindex(columns=columns)  # a column the store lacks comes back empty
    meta = getattr(run, "meta", {}) or {}
    write_json(path, {"stats": stats.to_dict("records"), "ranks": meta.get("ranks")})


def write_json(path: str, data: Any) -> None:
    """Write ``data`` (NaN kept as NaN, numpy scalars as numbers) where the test reads it."""
    with open(f"{path}.tmp", "w") as file:
        json.dump(data, file, default=_plain)
    os.replace(f"{path}.tmp", path)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray | tuple):
        return [_plain(item) if isinstance(item, np.generic) else item for item in value]
    raise TypeError(f"not JSON: {type(value).__name__}")
