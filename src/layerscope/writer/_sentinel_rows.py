"""The sentinel's rows: the minimum and maximum of each tensor on steps not recorded.

They become rows of their own, marked ``sentinel``, with ``numel``, ``min``, ``max`` and
``absmax`` over all elements and every other statistic missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from layerscope.model import Identities, StatsRows
from layerscope.recording import Arrived, Batch, Extreme
from layerscope.stats import StatSelection


@dataclass(slots=True)
class SentinelCarry:
    """Sentinel readings of a step that has not ended, and their pairs, already on the host."""

    extremes: list[Extreme]
    pairs: Tensor  # (len(extremes), 2) float64


def sentinel_rows(
    batches: Sequence[Batch],
    arrivals: Sequence[Mapping[int, Arrived]],
    rank: int,
    selection: StatSelection,
    identities: Identities,
    carry: SentinelCarry | None = None,
) -> tuple[StatsRows | None, SentinelCarry | None]:
    """The sentinel's rows of ``batches``, readings of one step and identity merged.

    Minima and maxima merge with NaN winning, as they were taken: a NaN anywhere shows. The
    readings of ``carry`` come first. Unless the last batch ends a step, that step's readings
    are not made into rows but returned, to be merged with the rest of the step's.
    """
    extremes = [*carry.extremes] if carry is not None else []
    extremes.extend(extreme for batch in batches for extreme in batch.extremes)
    if not extremes:
        return None, None
    pairs = torch.cat(
        ([carry.pairs] if carry is not None else [])
        + [_pairs(batch, arrived) for batch, arrived in zip(batches, arrivals, strict=True)]
    )
    kept = None
    if not batches[-1].final:
        # Steps only grow, so the unfinished step's readings are the last ones.
        unfinished = batches[-1].open_steps[0]
        cut = len(extremes)
        while cut > 0 and extremes[cut - 1].step >= unfinished:
            cut -= 1
        kept = SentinelCarry(extremes[cut:], pairs[cut:])
        extremes, pairs = extremes[:cut], pairs[:cut]
        if not extremes:
            return None, kept
    return _rows_of(extremes, pairs, rank, selection, identities), kept


def _rows_of(
    extremes: list[Extreme],
    pairs: Tensor,
    rank: int,
    selection: StatSelection,
    identities: Identities,
) -> StatsRows:
    groups: dict[tuple[int, int], int] = {}
    group_of = [groups.setdefault((e.step, e.identity), len(groups)) for e in extremes]
    first: dict[int, int] = {}
    for position, code in enumerate(group_of):
        first.setdefault(code, position)
    count = len(groups)
    group = torch.tensor(group_of)
    low = torch.full((count,), torch.inf, dtype=torch.float64)
    low = low.scatter_reduce(0, group, pairs[:, 0], reduce="amin")  # NaN propagates
    high = torch.full((count,), -torch.inf, dtype=torch.float64)
    high = high.scatter_reduce(0, group, pairs[:, 1], reduce="amax")
    numel = torch.zeros(count, dtype=torch.int64).index_add_(
        0, group, torch.tensor([e.numel for e in extremes], dtype=torch.int64)
    )
    measured = {
        "numel": numel,
        "min": low,
        "max": high,
        "absmax": torch.maximum(low.abs(), high.abs()),
    }
    keys = torch.tensor(list(groups), dtype=torch.int64).reshape(-1, 2)
    return StatsRows(
        step=keys[:, 0],
        identity=keys[:, 1],
        form=torch.tensor([extremes[first[g]].form for g in range(count)], dtype=torch.int64),
        identities=identities,
        rank=rank,
        stats={
            name: values
            for name, values in measured.items()
            if name == "numel" or name in selection.builtin
        },
        sentinel=True,
    )


def _pairs(batch: Batch, arrived: Mapping[int, Arrived]) -> Tensor:
    """The (min, max) pair of each of the batch's extremes, ``(len(extremes), 2)`` float64."""
    pairs = torch.empty(len(batch.extremes), 2, dtype=torch.float64)
    if not batch.extremes:
        return pairs
    buffer_of = torch.tensor([e.buffer for e in batch.extremes])
    pair_of = torch.tensor([e.pair for e in batch.extremes])
    for buffer, got in arrived.items():
        here = buffer_of == buffer
        pairs[here] = got.extremes[pair_of[here]]
    return pairs
