"""The collectives a process issues, in order, for tests that compare runs rank by rank.

Two views, checked against each other by the tests:

- ``CollectiveLog``: a ``TorchDispatchMode`` on the calling thread that logs every op of the
  ``c10d`` and ``_c10d_functional`` namespaces with the dtypes and shapes of its tensors. It
  sees the Python API (``dist.all_reduce``), C++ callers that go through the dispatcher (DDP's
  reducer, FSDP2's all-gathers and reduce-scatters) and functional collectives (DTensor). A
  mode is popped while it handles an op, so an op on a tensor subclass would hide the
  collectives the subclass issues; the log returns ``NotImplemented`` for those, the subclass
  runs with the log still active, and its collectives come back to it.
- ``flight_recorder_entries``: torch's flight recorder (``TORCH_FR_BUFFER_SIZE`` set before the
  process group starts), which records what each process group ran, from every thread.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})
# Ops of those namespaces that wait for or wrap a result and send nothing.
NOT_SENT = frozenset({"wait", "wait_tensor", "_wrap_tensor_autograd"})


class CollectiveLog(TorchDispatchMode):
    """Logs the collectives issued on this thread while it is active, as readable strings.

    Example:
        >>> with CollectiveLog() as log:
        ...     _ = torch.ones(2) + 1
        >>> log.calls
        []
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t.__name__ == "FakeTensor" for t in types):
            # Sharding propagation of DTensor runs ops on fake tensors: nothing is sent.
            return func(*args, **kwargs)
        if any(t not in (torch.Tensor, nn.Parameter) for t in types):
            return NotImplemented  # the subclass runs, and its own ops come back here
        if func.namespace in NAMESPACES and func._opname not in NOT_SENT:
            self.calls.append(describe(func, args, kwargs))
        return func(*args, **kwargs)

    def counts(self) -> dict[str, int]:
        """How many times each op was issued."""
        counts: dict[str, int] = {}
        for call in self.calls:
            op = call.split(" ", 1)[0]
            counts[op] = counts.get(op, 0) + 1
        return counts


def describe(func: Any, args: Any, kwargs: Any) -> str:
    """``op dtype[shape] ...`` of a call, e.g. ``c10d.allreduce_.default float32[61]``."""
    tensors = [
        f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
        for t in tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor)
    ]
    return " ".join([str(func), *tensors])


def flight_recorder_entries() -> list[dict[str, Any]]:
    """What the flight recorder holds: one dict per collective, oldest first.

    Each has ``record_id``, ``op`` (such as ``gloo:all_gather``), ``sizes`` (input and output
    sizes) and ``this_thread`` (issued on the calling thread). Empty where the recorder is off.
    """
    from torch._C._distributed_c10d import _dump_fr_trace_json

    trace = json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    thread = str(threading.get_ident())
    return [
        {
            "record_id": entry["record_id"],
            "op": entry["profiling_name"],
            "sizes": [entry["input_sizes"], entry["output_sizes"]],
            "this_thread": str(entry["thread_id"]) == thread,
        }
        for entry in trace.get("entries", [])
    ]
