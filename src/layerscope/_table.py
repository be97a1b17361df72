"""From readings on the device to rows of statistics on the host.

A reading is the metadata of one recorded tensor; its partials wait in a ``DeviceRows`` buffer.
At a flush the buffers come to the host in one copy each, readings of the same
(step, phase, module, kind, tensor, call) are merged (forward and backward kinds: micro-batches
and eval batches of a step add up) or replaced (parameter and buffer kinds: the last reading of
a step is the one after accumulation), and the merged partials are finalised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from layerscope._buffer import HostCopy
from layerscope._kinds import STATE_KINDS, Kind
from layerscope.stats import WIDTH, StatSelection, finalize, merge_groups

KEY_COLUMNS = ("step", "phase", "rank", "module", "module_type", "kind", "tensor", "call")
META_COLUMNS = ("dtype", "shape", "numel")


class Reading(NamedTuple):
    """Metadata of one recorded tensor; its partials are row ``row`` of buffer ``buffer``."""

    step: int
    phase: str
    module: str
    module_type: str
    kind: Kind
    tensor: str
    call: int
    dtype: str
    shape: tuple[int, ...]
    buffer: int
    row: int
    # (name, offset, length, is_scalar) of each custom statistic in the buffer's loose values
    custom: tuple[tuple[str, int, int, bool], ...] = ()


@dataclass(slots=True)
class Batch:
    """Readings of one flush and the copies that bring their buffers to the host."""

    readings: list[Reading]
    copies: dict[int, HostCopy]
    scalars: list[tuple[int, str, float | tuple[int, int]]] = field(default_factory=list)


@dataclass(slots=True)
class Chunk:
    """Finalised rows of one flush, column by column."""

    columns: dict[str, Sequence[Any] | Tensor]
    scalars: list[tuple[int, str, float]]

    def __len__(self) -> int:
        return len(self.columns["step"])


def finalize_batch(batch: Batch, rank: int, selection: StatSelection) -> Chunk:
    """Wait for the batch's copies, merge its readings and finalise them into columns."""
    arrived = {buffer: copy.wait() for buffer, copy in batch.copies.items()}
    scalars = [
        (step, name, value if isinstance(value, float) else _value(arrived, value))
        for step, name, value in batch.scalars
    ]
    readings = batch.readings
    if not readings:
        return Chunk(columns={name: [] for name in KEY_COLUMNS}, scalars=scalars)

    offsets, start = {}, 0
    for buffer, (rows, _) in arrived.items():
        offsets[buffer] = start
        start += rows.shape[0]
    all_rows = torch.cat([rows for rows, _ in arrived.values()])

    groups: dict[tuple[object, ...], list[int]] = {}
    for position, reading in enumerate(readings):
        key = reading[:7]
        if reading.kind in STATE_KINDS:
            groups[key] = [position]
        else:
            groups.setdefault(key, []).append(position)

    members = [position for positions in groups.values() for position in positions]
    group_of = torch.tensor(
        [gid for gid, positions in enumerate(groups.values()) for _ in positions],
        dtype=torch.int64,
    )
    chosen = torch.tensor(
        [offsets[readings[p].buffer] + readings[p].row for p in members], dtype=torch.int64
    )
    rows = all_rows[chosen]
    merged = merge_groups(rows[:, :WIDTH], group_of, len(groups))
    stats = finalize(merged)

    first = [readings[positions[0]] for positions in groups.values()]
    columns: dict[str, Sequence[Any] | Tensor] = {
        "step": [r.step for r in first],
        "phase": [r.phase for r in first],
        "rank": [rank] * len(first),
        "module": [r.module for r in first],
        "module_type": [r.module_type for r in first],
        "kind": [r.kind.value for r in first],
        "tensor": [r.tensor for r in first],
        "call": [r.call for r in first],
        "dtype": [r.dtype for r in first],
        "shape": [r.shape for r in first],
        "numel": stats["numel"],
    }
    for name in selection.builtin:
        if name != "hist":
            columns[name] = stats[name]
    if "hist" in selection.builtin and all_rows.shape[1] > WIDTH:
        hist = torch.zeros(len(groups), all_rows.shape[1] - WIDTH, dtype=torch.float64)
        hist.index_add_(0, group_of, rows[:, WIDTH:])
        counts = hist.to(torch.int64)
        columns["hist"] = [
            counts[gid] if _has_histogram(r.dtype) else None for gid, r in enumerate(first)
        ]
    for name in selection.custom:
        columns[name] = [
            _merge_custom(name, [readings[p] for p in positions], arrived)
            for positions in groups.values()
        ]
    return Chunk(columns=columns, scalars=scalars)


def _has_histogram(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _value(arrived: Mapping[int, tuple[Tensor, Tensor]], where: tuple[int, int]) -> float:
    buffer, offset = where
    return float(arrived[buffer][1][offset])


def _merge_custom(
    name: str, readings: list[Reading], arrived: Mapping[int, tuple[Tensor, Tensor]]
) -> float | list[float] | None:
    """A custom statistic of merged readings: their mean weighted by each reading's numel.

    None where no reading has it (a failed or skipped call) or where their lengths disagree.
    """
    total: Tensor | None = None
    weight_sum = 0.0
    scalar = True
    for reading in readings:
        for custom_name, offset, length, is_scalar in reading.custom:
            if custom_name != name:
                continue
            values = arrived[reading.buffer][1][offset : offset + length]
            if total is not None and values.shape != total.shape:
                return None
            weight = float(max(1, _numel(reading.shape)))
            total = values * weight if total is None else total + values * weight
            weight_sum += weight
            scalar = is_scalar
    if total is None:
        return None
    merged = total / weight_sum
    return float(merged[0]) if scalar else [float(value) for value in merged]


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def chunks_to_columns(chunks: Sequence[Chunk]) -> dict[str, list[Any]]:
    """All chunks' columns joined, as plain Python lists (tensors become lists of numbers)."""
    names: list[str] = []
    for chunk in chunks:
        for name in chunk.columns:
            if name not in names:
                names.append(name)
    joined: dict[str, list[Any]] = {name: [] for name in names}
    for chunk in chunks:
        size = len(chunk)
        for name in names:
            column = chunk.columns.get(name)
            if column is None:
                joined[name].extend([None] * size)
            elif isinstance(column, Tensor):
                joined[name].extend(column.tolist())
            else:
                joined[name].extend(column)
    return joined
