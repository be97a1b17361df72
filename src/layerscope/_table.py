"""From readings on the device to rows of statistics on the host.

A reading is one recorded tensor: its step, its identity (phase, module, kind, tensor, call,
dtype, shape, interned once as a small integer) and where its partials wait in a
``DeviceRows`` buffer. At a flush the buffers come to the host in one copy each, readings of
the same step and identity are merged (forward and backward kinds: micro-batches and eval
batches of a step add up) or replaced (parameter and buffer kinds: the last reading of a step
is the one after accumulation), and the merged partials are finalised. Key columns stay
integer codes until a consumer asks for them, so writers build them without a Python loop.

The sentinel's readings (the minimum and maximum of a tensor on a step that is not recorded)
become rows of their own, marked ``sentinel``, with ``numel``, ``min``, ``max`` and ``absmax``
over all elements and every other statistic missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from layerscope._buffer import Arrived, HostCopy
from layerscope._kinds import Kind
from layerscope._readings import (
    BUFFER,
    FIELDS,
    FORM,
    IDENTITY,
    REPLACES,
    ROW,
    STEP,
    CustomRef,
    Grouping,
    Readings,
    group_readings,
)
from layerscope.stats import WIDTH, StatSelection, finalize, merge_groups

KEY_COLUMNS = ("step", "phase", "rank", "module", "module_type", "kind", "tensor", "call")
META_COLUMNS = ("sentinel", "dtype", "shape", "shard", "numel")
#: What a sentinel row holds besides its keys; its other statistics are missing.
SENTINEL_STATS = ("numel", "min", "max", "absmax")
IDENTITY_COLUMNS = ("phase", "module", "module_type", "kind", "tensor", "call")
FORM_COLUMNS = ("dtype", "shape", "shard")


class Identity(NamedTuple):
    """What a row is about: readings with the same step and identity merge into one row."""

    phase: str
    module: str
    module_type: str
    kind: Kind
    tensor: str
    call: int


class Form(NamedTuple):
    """The dtype and shape of a reading; a merged row shows its first reading's.

    ``shard`` is ``"i/n"`` for this process's shard of a sharded tensor (a DTensor of FSDP2
    or tensor parallelism), whose statistics are of the local shard alone; None otherwise.
    """

    dtype: str
    shape: tuple[int, ...]
    shard: str | None = None

    @property
    def has_histogram(self) -> bool:
        """Floating dtypes have histograms; counts-only dtypes do not."""
        return self.dtype.startswith(("float", "bfloat"))


class _Interned:
    """Values each given a small integer code once.

    The training thread adds values; the writer thread reads those that readings refer to.
    Appending to and indexing a list are atomic, so neither needs a lock.
    """

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {}
        self.rows: list[Any] = []

    def code(self, value: Any) -> int:
        """The code of ``value``, given now if it is new."""
        code = self._codes.get(value)
        if code is None:
            code = len(self.rows)
            self.rows.append(value)
            self._codes[value] = code
        return code


class Identities:
    """The interned identities and forms of a scope's rows.

    ``cache`` holds views that consumers derive from them (such as Arrow arrays).
    """

    def __init__(self) -> None:
        self._identities = _Interned()
        self._forms = _Interned()
        self.cache: dict[str, Any] = {}

    @property
    def identities(self) -> list[Identity]:
        """Every identity, by code."""
        return self._identities.rows

    @property
    def forms(self) -> list[Form]:
        """Every form, by code."""
        return self._forms.rows

    def code(self, identity: Identity) -> int:
        """The code of ``identity``, given now if it is new."""
        return self._identities.code(identity)

    def form_code(self, form: Form) -> int:
        """The code of ``form``, given now if it is new."""
        return self._forms.code(form)


class Extreme(NamedTuple):
    """A sentinel reading: the (min, max) pair ``pair`` of buffer ``buffer``."""

    step: int
    identity: int
    form: int
    buffer: int
    pair: int
    numel: int


@dataclass(slots=True)
class Batch:
    """Readings of one flush and the copies that bring their buffers to the host.

    ``final`` marks the last flush of a step; earlier ones (a step with many forward passes
    flushes when its buffer fills) leave their merged partials to be merged with the next.
    Even then, training rows of steps before ``open_steps[0]`` and evaluation rows of steps
    before ``open_steps[1]`` are complete; ``evaluated`` marks a flush after which all
    evaluation rows are (an evaluation has ended, or a reader asks for its rows) while the
    step's training rows may still grow.
    """

    readings: Readings
    copies: dict[int, HostCopy]
    scalars: list[tuple[int, str, float | tuple[int, int]]] = field(default_factory=list)
    final: bool = True
    extremes: list[Extreme] = field(default_factory=list)
    evaluated: bool = False
    open_steps: tuple[int, int] = (0, 0)  # (training, evaluation)


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


@dataclass(slots=True)
class Chunk:
    """Finalised rows of one flush: integer keys, statistics and histograms as arrays."""

    step: Tensor  # (rows,) int64
    identity: Tensor  # (rows,) int64 codes of ``identities.identities``
    form: Tensor  # (rows,) int64 codes of ``identities.forms``
    identities: Identities
    rank: int
    stats: dict[str, Tensor]  # numel and the built-in statistics kept, each (rows,)
    custom: dict[str, list[Any]] = field(default_factory=dict)
    hist: Tensor | None = None  # (rows, slots) float64 counts (exact below 2**53), if kept
    sentinel: bool = False  # rows of the sentinel: only SENTINEL_STATS are there

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def key_columns(self) -> dict[str, list[Any]]:
        """``step``, ``rank`` and the identity and form columns, decoded to Python values."""
        table, forms = self.identities.identities, self.identities.forms
        rows = [table[code] for code in self.identity.tolist()]
        shapes = [forms[code] for code in self.form.tolist()]
        columns: dict[str, list[Any]] = {
            "step": self.step.tolist(),
            "rank": [self.rank] * len(rows),
            "sentinel": [self.sentinel] * len(rows),
        }
        for position, name in enumerate(IDENTITY_COLUMNS):
            columns[name] = [row[position] for row in rows]
        columns["kind"] = [kind.value for kind in columns["kind"]]
        for position, name in enumerate(FORM_COLUMNS):
            columns[name] = [form[position] for form in shapes]
        return columns

    def columns(self) -> dict[str, Any]:
        """Every column but ``hist``, by name: key columns decoded, statistics as tensors."""
        return {**self.key_columns(), **self.stats, **self.custom}

    def hist_valid(self) -> list[bool]:
        """Which rows have a histogram (counts-only dtypes do not)."""
        forms = self.identities.forms
        return [forms[code].has_histogram for code in self.form.tolist()]


def arrive(batch: Batch) -> dict[int, Arrived]:
    """Wait for the batch's copies to reach the host."""
    return {buffer: copy.wait() for buffer, copy in batch.copies.items()}


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
        return Merged(merged.keys[mask], merged.forms[mask], merged.rows[mask], custom)

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
) -> Chunk:
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
        for name in selection.custom
    }
    has_hist = "hist" in selection.builtin and merged.rows.shape[1] > WIDTH
    return Chunk(
        step=keys[:, 0],
        identity=keys[:, 1],
        form=merged.forms,
        identities=identities,
        rank=rank,
        stats=kept,
        custom=custom,
        hist=merged.rows[:, WIDTH:] if has_hist else None,
    )


@dataclass(slots=True)
class SentinelCarry:
    """Sentinel readings of a step that has not ended, and their pairs, already on the host."""

    extremes: list[Extreme]
    pairs: Tensor  # (len(extremes), 2) float64


def sentinel_chunk(
    batches: Sequence[Batch],
    arrivals: Sequence[Mapping[int, Arrived]],
    rank: int,
    selection: StatSelection,
    identities: Identities,
    carry: SentinelCarry | None = None,
) -> tuple[Chunk | None, SentinelCarry | None]:
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
    return _sentinel_rows(extremes, pairs, rank, selection, identities), kept


def _sentinel_rows(
    extremes: list[Extreme],
    pairs: Tensor,
    rank: int,
    selection: StatSelection,
    identities: Identities,
) -> Chunk:
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
    return Chunk(
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


def chunks_to_columns(chunks: Sequence[Chunk]) -> dict[str, list[Any]]:
    """All chunks' columns joined as Python lists; ``hist`` holds int64 tensors or None."""
    joined: dict[str, list[Any]] = {}
    hist: list[Tensor | None] = []
    rows = 0
    for chunk in chunks:
        size = len(chunk)
        for name, column in chunk.columns().items():
            values = column.tolist() if isinstance(column, Tensor) else column
            # A column the earlier chunks lacked (sentinel rows have few) is missing there.
            joined.setdefault(name, [None] * rows).extend(values)
        rows += size
        for column in joined.values():
            column.extend([None] * (rows - len(column)))
        if chunk.hist is None:
            hist.extend([None] * size)
        else:
            counts = chunk.hist.to(torch.int64)
            hist.extend(
                row if valid else None
                for row, valid in zip(counts, chunk.hist_valid(), strict=True)
            )
    joined["hist"] = hist
    return joined
