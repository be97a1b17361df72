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
    """Readings of one flush and the copies that bring their buffers to the host.

    ``final`` marks the last flush of a step; earlier ones (a step with many forward passes
    flushes when its buffer fills) leave their merged partials to be merged with the next.
    """

    readings: list[Reading]
    copies: dict[int, HostCopy]
    scalars: list[tuple[int, str, float | tuple[int, int]]] = field(default_factory=list)
    final: bool = True

    def landed(self) -> bool:
        """Whether every copy has arrived, asked without waiting."""
        return all(copy.landed() for copy in self.copies.values())


# A custom statistic of a group being merged: numel-weighted sum, total weight, and whether the
# function returned a 0-d tensor. A None sum marks values whose lengths disagreed.
_CustomSum = tuple[Tensor | None, float, bool]


@dataclass(slots=True)
class Merged:
    """Readings merged on the host but not finalised: one row per group."""

    first: list[Reading]  # metadata of each group: its first reading
    rows: Tensor  # (groups, row_width) float64: merged partials, then histogram counts
    custom: list[dict[str, _CustomSum]]


@dataclass(slots=True)
class Chunk:
    """Finalised rows of one step, column by column."""

    columns: dict[str, Sequence[Any] | Tensor]
    hist: Tensor | None = None  # (rows, slots) int64 counts, if histograms are kept
    hist_valid: list[bool] = field(default_factory=list)  # False: counts-only dtype, no counts

    def __len__(self) -> int:
        return len(self.columns["step"])


def merge_batch(
    batch: Batch, carry: Merged | None
) -> tuple[Merged | None, list[tuple[int, str, float]]]:
    """Wait for the batch's copies and merge its readings, and what ``carry`` holds, by key.

    Readings of forward and backward kinds that share (step, phase, module, kind, tensor,
    call) merge; for parameter and buffer kinds the latest reading replaces earlier ones.
    """
    arrived = {buffer: copy.wait() for buffer, copy in batch.copies.items()}
    scalars = [
        (step, name, value if isinstance(value, float) else _value(arrived, value))
        for step, name, value in batch.scalars
    ]
    sources = [carry.rows] if carry is not None else []
    offsets: dict[int, int] = {}
    start = sources[0].shape[0] if sources else 0
    for buffer, (rows, _) in arrived.items():
        offsets[buffer] = start
        start += rows.shape[0]
        sources.append(rows)
    if start == 0:
        return None, scalars

    # Each group: the rows it merges, its first reading and its custom statistics.
    groups: dict[tuple[object, ...], tuple[list[int], Reading, dict[str, _CustomSum]]] = {}

    def add(reading: Reading, row: int, custom: dict[str, _CustomSum]) -> None:
        key = reading[:7]
        entry = groups.get(key)
        if entry is None or reading.kind in STATE_KINDS:
            groups[key] = ([row], entry[1] if entry else reading, dict(custom))
            return
        entry[0].append(row)
        for name, value in custom.items():
            entry[2][name] = _add_custom(entry[2].get(name), value)

    if carry is not None:
        for row, (reading, custom) in enumerate(zip(carry.first, carry.custom, strict=True)):
            add(reading, row, custom)
    for reading in batch.readings:
        values = arrived[reading.buffer][1]
        weight = float(max(1, _numel(reading.shape)))
        custom = {
            name: (values[offset : offset + length] * weight, weight, is_scalar)
            for name, offset, length, is_scalar in reading.custom
        }
        add(reading, offsets[reading.buffer] + reading.row, custom)

    all_rows = torch.cat(sources)
    chosen = torch.tensor([row for rows, _, _ in groups.values() for row in rows])
    group_of = torch.tensor(
        [gid for gid, (rows, _, _) in enumerate(groups.values()) for _ in rows],
        dtype=torch.int64,
    )
    picked = all_rows[chosen]
    merged = torch.zeros(len(groups), all_rows.shape[1], dtype=torch.float64)
    merged[:, :WIDTH] = merge_groups(picked[:, :WIDTH], group_of, len(groups))
    merged[:, WIDTH:].index_add_(0, group_of, picked[:, WIDTH:])
    return (
        Merged(
            first=[first for _, first, _ in groups.values()],
            rows=merged,
            custom=[custom for _, _, custom in groups.values()],
        ),
        scalars,
    )


def finalize_merged(merged: Merged, rank: int, selection: StatSelection) -> Chunk:
    """Turn merged partials into the columns of the stats table."""
    first = merged.first
    stats = finalize(merged.rows[:, :WIDTH])
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
    for name in selection.custom:
        columns[name] = [_custom_value(custom.get(name)) for custom in merged.custom]
    if "hist" in selection.builtin and merged.rows.shape[1] > WIDTH:
        return Chunk(
            columns=columns,
            hist=merged.rows[:, WIDTH:].to(torch.int64),
            hist_valid=[_has_histogram(r.dtype) for r in first],
        )
    return Chunk(columns=columns)


def _add_custom(total: _CustomSum | None, value: _CustomSum) -> _CustomSum:
    if total is None:
        return value
    total_sum, total_weight, _ = total
    value_sum, value_weight, is_scalar = value
    if total_sum is None or value_sum is None or total_sum.shape != value_sum.shape:
        return None, 0.0, is_scalar
    return total_sum + value_sum, total_weight + value_weight, is_scalar


def _custom_value(total: _CustomSum | None) -> float | list[float] | None:
    """A merged custom statistic: the numel-weighted mean of its readings, or None."""
    if total is None:
        return None
    values, weight, is_scalar = total
    if values is None:
        return None
    mean: Tensor = values / weight
    return float(mean[0]) if is_scalar else [float(v) for v in mean]


def _has_histogram(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _value(arrived: Mapping[int, tuple[Tensor, Tensor]], where: tuple[int, int]) -> float:
    buffer, offset = where
    return float(arrived[buffer][1][offset])


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def chunks_to_columns(chunks: Sequence[Chunk]) -> dict[str, list[Any]]:
    """All chunks' columns joined as Python lists; ``hist`` holds int64 tensors or None."""
    names: list[str] = []
    for chunk in chunks:
        for name in chunk.columns:
            if name not in names:
                names.append(name)
    joined: dict[str, list[Any]] = {name: [] for name in names}
    hist: list[Tensor | None] = []
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
        if chunk.hist is None:
            hist.extend([None] * size)
        else:
            hist.extend(
                h if valid else None for h, valid in zip(chunk.hist, chunk.hist_valid, strict=True)
            )
    joined["hist"] = hist
    return joined
