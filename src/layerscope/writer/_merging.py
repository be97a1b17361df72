"""Merging readings on the host, and finalising them into rows of statistics.

At a flush the buffers come to the host in one copy each, readings of the same step and
identity are merged (forward and backward kinds: micro-batches and eval batches of a step add
up) or replaced (parameter and buffer kinds: the last reading of a step is the one after
accumulation), and the merged partials are finalised. Key columns stay integer codes until a
consumer asks for them, so writers build them without a Python loop. A log2 histogram split by
sign merges split, slot by slot, and is finalised into the magnitudes and the negative half.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from layerscope.model import Identities, StatsRows
from layerscope.recording import (
    BUFFER,
    FIELDS,
    FORM,
    IDENTITY,
    REPLACES,
    ROW,
    STEP,
    Arrived,
    Batch,
    CustomRef,
    Grouping,
    group_readings,
)
from layerscope.stats import LOG2_BINS, WIDTH, StatSelection, finalize, merge_groups

# A custom statistic of a group being merged: numel-weighted sum, total weight, and whether the
# function returned a 0-d tensor. A None sum marks values whose lengths disagreed.
_CustomSum = tuple[Tensor | None, float, bool]


@dataclass(slots=True)
class Merged:
    """Readings merged on the host but not finalised: one row per (step, identity)."""

    keys: Tensor  # (groups, 2) int64: step and identity of each row
    forms: Tensor  # (groups,) int64: form of each row's first reading
    rows: Tensor  # (groups, row_width) float64: merged partials, then histogram counts
    custom: list[dict[str, _CustomSum]] | None  # None where no reading has custom statistics
    signed: bool = False  # the histogram is the log2 one split by sign (Batch.signed_log2)


def merge_batches(
    batches: Sequence[Batch], carry: Merged | None, arrivals: Sequence[Mapping[int, Arrived]]
) -> tuple[Merged | None, list[tuple[int, str, float]]]:
    """Merge the readings of ``batches`` (in order), and what ``carry`` holds, by key.

    ``arrivals`` holds each batch's arrived buffers. Readings of forward and backward kinds
    that share step and identity merge; for parameter and buffer kinds the latest reading
    replaces earlier ones. Batches of many steps merge in one go: keys hold the step.
    """
    scalars = [
        (step, name, value if isinstance(value, float) else _value(arrived, value))
        for batch, arrived in zip(batches, arrivals, strict=True)
        for step, name, value in batch.scalars
    ]
    sources = [carry.rows] if carry is not None else []
    parts = [_carried_readings(carry)] if carry is not None else []
    customs: list[tuple[int, Tensor, tuple[CustomRef, ...]]] = []  # reading, values, refs
    start = sources[0].shape[0] if sources else 0
    count = start  # readings so far, the carried rows first
    for batch, arrived in zip(batches, arrivals, strict=True):
        offsets = {}
        for buffer, (rows, _, _) in arrived.items():
            offsets[buffer] = start
            start += rows.shape[0]
            sources.append(rows)
        columns = batch.readings.columns()
        if columns.shape[0]:
            parts.append(_global_rows(columns, offsets))
        for index, refs in batch.readings.custom.items():
            customs.append((count + index, arrived[int(columns[index, BUFFER])].values, refs))
        count += columns.shape[0]
    if count == 0:
        return None, scalars

    readings = parts[0] if len(parts) == 1 else torch.cat(parts)
    # One int64 key per (step, identity): identity codes stay far below 2**32.
    grouping = group_readings(
        (readings[:, STEP] << 32) | readings[:, IDENTITY], readings[:, REPLACES]
    )
    groups = grouping.first.shape[0]
    rows, group = readings[:, ROW], grouping.group
    if grouping.kept is not None:
        rows, group = rows[grouping.kept], group[grouping.kept]
    all_rows = sources[0] if len(sources) == 1 else torch.cat(sources)
    if rows.shape[0] == groups:  # one reading per row, the usual case: nothing to merge
        row_of = torch.empty_like(rows)
        row_of[group] = rows
        merged = all_rows[row_of]
    else:
        picked = all_rows[rows]
        merged = torch.zeros(groups, all_rows.shape[1], dtype=torch.float64)
        merged[:, :WIDTH] = merge_groups(picked[:, :WIDTH], group, groups)
        merged[:, WIDTH:].index_add_(0, group, picked[:, WIDTH:])
    first = readings[grouping.first]
    return (
        Merged(
            keys=first[:, [STEP, IDENTITY]],
            forms=first[:, FORM],
            rows=merged,
            custom=_merged_custom(carry, customs, grouping),
            signed=any(batch.signed_log2 for batch in batches),
        ),
        scalars,
    )


def split_merged(
    merged: Merged, identities: Identities, open_steps: tuple[int, int], evaluated: bool
) -> tuple[Merged | None, Merged | None]:
    """``merged`` as (complete rows, rows that may still grow); None for a part with none.

    See ``Batch`` for which rows are complete.
    """
    table = identities.identities
    codes = merged.keys[:, 1].tolist()
    is_eval = torch.tensor([table[code].phase == "eval" for code in codes], dtype=torch.bool)
    steps = merged.keys[:, 0]
    eval_done = torch.ones_like(is_eval) if evaluated else steps < open_steps[1]
    done = torch.where(is_eval, eval_done, steps < open_steps[0])

    def part(mask: Tensor) -> Merged | None:
        if not bool(mask.any()):
            return None
        custom = merged.custom
        if custom is not None:
            custom = [sums for sums, keep in zip(custom, mask.tolist(), strict=True) if keep]
        rows = merged.rows[mask]
        return Merged(merged.keys[mask], merged.forms[mask], rows, custom, merged.signed)

    return part(done), part(~done)


def _carried_readings(carry: Merged) -> Tensor:
    """The rows a carry holds, as readings that come before a flush's own."""
    readings = torch.zeros(carry.keys.shape[0], FIELDS, dtype=torch.int64)
    readings[:, STEP] = carry.keys[:, 0]
    readings[:, IDENTITY] = carry.keys[:, 1]
    readings[:, FORM] = carry.forms
    readings[:, ROW] = torch.arange(carry.keys.shape[0])
    return readings


def _global_rows(columns: Tensor, offsets: Mapping[int, int]) -> Tensor:
    """``columns`` with each row counted from the start of all the flush's buffers."""
    columns = columns.clone()  # not the recorder's memory
    if len(offsets) == 1:
        columns[:, ROW] += next(iter(offsets.values()))
    else:
        table = torch.zeros(max(offsets) + 1, dtype=torch.int64)
        for buffer, offset in offsets.items():
            table[buffer] = offset
        columns[:, ROW] += table[columns[:, BUFFER]]
    return columns


def _merged_custom(
    carry: Merged | None,
    customs: Sequence[tuple[int, Tensor, tuple[CustomRef, ...]]],
    grouping: Grouping,
) -> list[dict[str, _CustomSum]] | None:
    """Custom statistics of each group, summed over its kept readings in order."""
    carried = carry.custom if carry is not None else None
    if carried is None and not customs:
        return None
    merged: list[dict[str, _CustomSum]] = [{} for _ in range(grouping.first.shape[0])]
    group = grouping.group.tolist()
    kept = grouping.kept.tolist() if grouping.kept is not None else None
    for index, sums in enumerate(carried or ()):
        if kept is None or kept[index]:
            merged[group[index]] = dict(sums)
    for index, values, refs in customs:
        if kept is not None and not kept[index]:
            continue
        sums = merged[group[index]]
        for name, value in _custom_sums(values, refs).items():
            sums[name] = _add_custom(sums.get(name), value)
    return merged


def finalize_merged(
    merged: Merged, rank: int, selection: StatSelection, identities: Identities
) -> StatsRows:
    """Turn merged partials into a chunk of the stats table."""
    keys = merged.keys
    stats = finalize(merged.rows[:, :WIDTH])
    kept = {"numel": stats["numel"]}
    kept.update({name: stats[name] for name in selection.builtin if name != "hist"})
    rows = keys.shape[0]
    custom = {
        name: [_custom_value(sums.get(name)) for sums in merged.custom]
        if merged.custom is not None
        else [None] * rows
        for name in selection.custom_columns  # null in rows of kinds without it
    }
    hist = negative = None
    if "hist" in selection.builtin and merged.rows.shape[1] > WIDTH:
        hist = merged.rows[:, WIDTH:]
        if merged.signed:  # the magnitudes are the halves' sum: as counted unsplit, exactly
            negative = hist[:, LOG2_BINS:]
            hist = hist[:, :LOG2_BINS] + negative
    return StatsRows(
        step=keys[:, 0],
        identity=keys[:, 1],
        form=merged.forms,
        identities=identities,
        rank=rank,
        stats=kept,
        custom=custom,
        hist=hist,
        negative=negative,
    )


def _custom_sums(values: Tensor, refs: tuple[CustomRef, ...]) -> dict[str, _CustomSum]:
    sums: dict[str, _CustomSum] = {}
    for name, offset, length, is_scalar, numel in refs:
        weight = float(max(1, numel))
        sums[name] = (values[offset : offset + length] * weight, weight, is_scalar)
    return sums


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


def _value(arrived: Mapping[int, Arrived], where: tuple[int, int]) -> float:
    buffer, offset = where
    return float(arrived[buffer].values[offset])
