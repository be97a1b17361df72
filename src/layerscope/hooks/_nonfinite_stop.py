"""``alerts="raise"``: stop training at the first non-finite value, at the step it happens.

At the end of each step the readings of that step still wait in the device buffers: one
check over them per device, a single flag read back to the host, says whether any held a NaN
or an Inf. Only then are they looked at one by one, in the order they were recorded: the
forward pass in call order, then the backward pass, then the parameters.
"""

from __future__ import annotations

import dataclasses

import torch

from layerscope._config import WatchConfig
from layerscope._errors import NonFiniteError
from layerscope._schedule import Schedule
from layerscope.model import Identity
from layerscope.recording import BUFFER, IDENTITY, ROW, STEP, Recorder


def stop_schedule(config: WatchConfig) -> Schedule:
    """The schedule, with the sentinel on every step where training stops at NaN or Inf.

    Unless the schedule itself says the sentinel must not run.
    """
    schedule = config.schedule
    if config.alerts.raise_on_nonfinite and schedule.sentinel is None:
        return dataclasses.replace(schedule, sentinel=True)
    return schedule


def nonfinite_error(recorder: Recorder, step: int, skipped: bool = False) -> NonFiniteError | None:
    """The error to stop with if a reading of ``step`` waiting in ``recorder`` is not finite.

    A step whose optimizer step was skipped (GradScaler found an Inf) with only its gradients
    non-finite is GradScaler doing its work: it lowers the scale and goes on. No error.
    """
    found = _nonfinite(recorder, step)
    identities = [recorder.identities.identities[code] for code in found]
    if not identities or (skipped and all(i.kind.value in _GRADIENTS for i in identities)):
        return None
    return NonFiniteError(_message(identities[0], step))


# What a loss scaled too far makes non-finite while the forward pass stays finite.
_GRADIENTS = ("grad", "input_grad", "weight_grad")


def _nonfinite(recorder: Recorder, step: int) -> list[int]:
    """The identity codes of the readings of ``step`` that are not finite, in recording order."""
    buffers = dict(recorder.buffers.values())
    candidates: list[int] = []  # identity codes, in recording order
    flags = []
    columns = recorder.readings.columns()
    if len(columns):
        mine = columns[columns[:, STEP] == step]
        for buffer_id, rows in buffers.items():
            own = mine[mine[:, BUFFER] == buffer_id]
            if len(own):
                flags.append(rows.nonfinite_rows(own[:, ROW]))
                candidates += own[:, IDENTITY].tolist()
    extremes = [e for e in recorder.extremes if e.step == step]
    for buffer_id, rows in buffers.items():
        own_pairs = [e for e in extremes if e.buffer == buffer_id]
        if own_pairs:
            flags.append(rows.nonfinite_pairs(torch.tensor([e.pair for e in own_pairs])))
            candidates += [e.identity for e in own_pairs]
    if not flags:
        return []
    joined = torch.cat([flag.cpu() for flag in flags])  # the one read back to the host
    return [int(candidates[index]) for index in joined.nonzero().flatten().tolist()]


def _message(identity: Identity, step: int) -> str:
    direction = {
        "activation": "in the forward pass",
        "input": "in the forward pass",
        "grad": "in the backward pass",
        "input_grad": "in the backward pass",
        "weight_grad": "in the backward pass",
    }.get(identity.kind.value, "in the optimizer step")
    name = identity.module or "the model"
    return (
        f"non-finite value at step {step} {direction}: the {identity.kind.value} "
        f"{identity.tensor} of {name} ({identity.module_type}) holds NaN or Inf, the first "
        "one recorded in this step (alerts='raise' stops training here)"
    )
