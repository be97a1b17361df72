"""What the tracker sinks (TensorBoard, W&B, MLflow) show of a flush's rows, and under which names.

Every tracker shows a recorded tensor under the same tag, ``{phase}/{kind}/{module}/{tensor}``,
so that a chart found in one is found in the others under the same name: the root module is
``<root>``, and a module's second and later calls in a step add ``#{call}`` to the tensor
(``out#1``). Each chosen statistic is a scalar ``{tag}/{stat}``. Histograms keep the run's
slots, but a log2 histogram counted split by sign (``StatsRows.negative``) is drawn over signed
values, in the bins of ``signed_log2_bin_edges``; ``histogram_bins`` turns the occupied ones
into counts and finite edges, as trackers that draw histograms from bin edges want them. Each
head of an attention call is a tensor of kind ``attention``, ``head{n}``, with the scalars
``entropy_mean`` and ``entropy_frac``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from layerscope.model import AttentionRow, StatsRows
from layerscope.stats import LOG2_BINS, signed_log2_bin_edges

if TYPE_CHECKING:
    from layerscope.sinks._base import RunInfo

ROOT = "<root>"

#: The statistics that become charts unless a sink is told otherwise.
DEFAULT_STATS = ("mean", "std", "absmax", "l2", "zero_frac", "nan_count")

#: An alert's fields, in the order of the run's alerts table, for the sinks that list them.
ALERT_COLUMNS = (
    "step",
    "phase",
    "rule",
    "module",
    "kind",
    "tensor",
    "severity",
    "value",
    "threshold",
    "message",
)


#: The columns of the attention table that become charts.
ATTENTION_STATS = ("entropy_mean", "entropy_frac")

#: Lower edges of the bins of a log2 histogram drawn over signed values.
SIGNED_EDGES = signed_log2_bin_edges()


def attention_values(rows: Sequence[AttentionRow]) -> Iterator[tuple[int, str, float]]:
    """``(step, name, value)`` of each head's charted columns; NaN (no query) left out.

    Examples:
        >>> row = AttentionRow(3, "train", 0, "h.0", 0, 1, 8, 1.5, 0.2, 0.72, 0.4)
        >>> [name for _, name, _ in attention_values([row])]
        ['train/attention/h.0/head1/entropy_mean', 'train/attention/h.0/head1/entropy_frac']
    """
    for row in rows:
        tag = tag_of(row.phase, "attention", row.module, f"head{row.head}", row.call)
        for name in ATTENTION_STATS:
            value = getattr(row, name)
            if not math.isnan(value):
                yield row.step, f"{tag}/{name}", value


def tag_of(phase: str, kind: str, module: str, tensor: str, call: int) -> str:
    """The tag of one recorded tensor.

    Examples:
        >>> tag_of("train", "activation", "", "out", 1)
        'train/activation/<root>/out#1'
    """
    tensor = tensor + (f"#{call}" if call else "")
    return f"{phase}/{kind}/{module or ROOT}/{tensor}"


def chosen_stats(stats: str | Sequence[str]) -> tuple[str, ...]:
    """``stats`` as a tuple of names; one name is one statistic, not its letters."""
    return (stats,) if isinstance(stats, str) else tuple(stats)


@dataclass(frozen=True, slots=True)
class TaggedRow:
    """One row of a flush as a tracker shows it.

    ``values`` holds the chosen statistics this row has, NaN and non-numbers (a custom
    statistic's several values) left out. ``counts`` are its histogram's counts from the
    first occupied slot, ``first``, to the last, if it has a histogram with any count and
    histograms were asked for: in the run's slots, or where ``signed``, in the bins of
    ``SIGNED_EDGES``. ``index`` is its position in the flush's ``StatsRows``.
    """

    index: int
    tag: str
    step: int
    values: dict[str, float]
    counts: list[int] | None
    first: int = 0
    signed: bool = False

    def edges(self, run_edges: Sequence[float] | None) -> Sequence[float] | None:
        """The lower edges of the slots ``counts`` are in: the run's, or the signed bins."""
        return SIGNED_EDGES if self.signed else run_edges


def tagged_rows(chunk: StatsRows, stats: Sequence[str], histograms: bool) -> Iterator[TaggedRow]:
    """The rows of ``chunk`` with their tags, chosen statistics and occupied histogram slots."""
    columns = chunk.columns()
    values = {name: as_list(columns[name]) for name in stats if name in columns}
    steps = as_list(columns["step"])
    phases, kinds, modules = columns["phase"], columns["kind"], columns["module"]
    tensors, calls = columns["tensor"], columns["call"]
    occupied = _occupied(chunk) if histograms else None
    signed = chunk.negative is not None
    for row in range(len(chunk)):
        chosen = {}
        for name, column in values.items():
            value = column[row]
            if _is_number(value):
                chosen[name] = value
        found = occupied[row] if occupied is not None else None
        counts, first = found if found is not None else (None, 0)
        tag = tag_of(phases[row], kinds[row], modules[row], tensors[row], calls[row])
        yield TaggedRow(row, tag, int(steps[row]), chosen, counts, first, signed)


def _occupied(chunk: StatsRows) -> list[tuple[list[int], int] | None] | None:
    """Each row's counts from its first to its last occupied slot, and that first slot.

    Found for all rows at once: a histogram has hundreds of slots and a few dozen occupied,
    and a per-row Python scan of them all was most of a tracker sink's cost. A log2 histogram
    split by sign is in the signed bins (``signed_counts``).
    """
    hist = chunk.hist
    if hist is None:
        return None
    if chunk.negative is not None:
        hist = signed_counts(hist, chunk.negative)
    occupied = hist > 0  # (rows, slots)
    slots = occupied.shape[1]
    rows_with = (occupied.any(dim=1) & torch.tensor(chunk.hist_valid(), dtype=torch.bool)).tolist()
    firsts = occupied.to(torch.uint8).argmax(dim=1).tolist()
    lasts = (slots - 1 - occupied.flip(1).to(torch.uint8).argmax(dim=1)).tolist()
    counts = hist.to(torch.int64)
    return [
        (counts[row, first : last + 1].tolist(), first) if kept else None
        for row, (kept, first, last) in enumerate(zip(rows_with, firsts, lasts, strict=True))
    ]


def signed_counts(hist: Tensor, negative: Tensor) -> Tensor:
    """Counts of the bins of ``SIGNED_EDGES`` from a log2 histogram and its negative half.

    ``hist`` and ``negative`` are ``(rows, 256)`` counts of magnitudes and of the values whose
    sign bit is set; the result is ``(rows, 509)``: the negative bins 254 down to 1, the zeros
    and subnormals of both signs, the positive bins 1 to 254. Inf and NaN (slot 255) have no
    bin.

    Examples:
        >>> hist = torch.zeros(1, 256)
        >>> hist[0, [0, 127, 128]] = torch.tensor([2.0, 3.0, 1.0])  # zeros, [1, 2), [2, 4)
        >>> negative = torch.zeros(1, 256)
        >>> negative[0, [0, 128]] = torch.tensor([1.0, 1.0])  # -0.0 and a value in (-4, -2]
        >>> counts = signed_counts(hist, negative)[0]
        >>> [(SIGNED_EDGES[b], int(counts[b])) for b in torch.nonzero(counts).flatten().tolist()]
        [(-4.0, 1), (-1.1754943508222875e-38, 2), (1.0, 3)]
    """
    normal = slice(1, LOG2_BINS - 1)
    positive = hist[:, normal] - negative[:, normal]
    return torch.cat([negative[:, normal].flip(1), hist[:, :1], positive], dim=1)


def _is_number(value: Any) -> bool:
    """A number to chart: not NaN (a statistic of no values), not a bool, not a list."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not (isinstance(value, float) and math.isnan(value))


def histogram_bins(
    counts: Sequence[int],
    first: int,
    edges: Sequence[float],
    low: float | None,
    high: float | None,
) -> tuple[list[int], list[float]] | None:
    """Counts of the occupied slots, first to last, and their ``len(counts) + 1`` edges.

    ``counts`` start at slot ``first``; ``edges`` are the run's lower slot edges
    (``RunInfo.histogram_edges``). A slot whose lower edge is infinite at the top (the log2
    histogram's slot of Inf and NaN) is left out: those values are ``inf_count`` and
    ``nan_count``. An open end (a linear histogram's underflow and overflow slots, the top
    log2 slot) gets a finite edge: the row's ``low`` or ``high`` value where it lies beyond
    the slot's other edge, else one more width of the neighbouring slot. None when no slot
    with a finite lower edge is occupied.

    Examples:
        >>> histogram_bins([0, 3, 1, 0], 0, [0.0, 0.5, 1.0, 2.0], None, None)
        ([3, 1], [0.5, 1.0, 2.0])
    """
    # The occupied slots are few and mostly trimmed already: walk in from both ends.
    end = len(counts)
    while end and (not counts[end - 1] or edges[first + end - 1] == math.inf):
        end -= 1
    begin = 0
    while begin < end and not counts[begin]:
        begin += 1
    if begin == end:
        return None
    start, last = first + begin, first + end - 1
    uppers = [*edges[1:], math.inf]
    bounds = [float(edge) for edge in edges[start : last + 1]] + [float(uppers[last])]
    if math.isinf(bounds[0]):  # the underflow slot: (-inf, lo)
        upper = bounds[1]
        width = _width(edges, start + 1, upper)
        bounds[0] = low if low is not None and math.isfinite(low) and low < upper else upper - width
    if math.isinf(bounds[-1]):  # the overflow slot: [hi, inf)
        lower = bounds[-2]
        width = _width(edges, last - 1, lower)
        finite_high = high is not None and math.isfinite(high) and high > lower
        bounds[-1] = high if finite_high and high is not None else lower + width
    return [int(count) for count in counts[start - first : last - first + 1]], bounds


def row_bins(
    row: TaggedRow, run_edges: Sequence[float] | None, low: float | None, high: float | None
) -> tuple[list[int], list[float]] | None:
    """``histogram_bins`` of ``row``, in its slots' edges (``TaggedRow.edges``).

    A signed log2 histogram's runs of empty bins become one bin each: between a tensor's
    smallest values and its zeros lie a hundred or more empty powers of two of each sign, and
    the occupied bins keep their edges all the same.

    Examples:
        >>> row = TaggedRow(0, "t", 0, {}, [1, 0, 0, 2], 381, signed=True)  # [1, 2) to [8, 16)
        >>> row_bins(row, None, -1.0, 12.0)
        ([1, 0, 2], [1.0, 2.0, 8.0, 16.0])
    """
    edges = row.edges(run_edges)
    if row.counts is None or edges is None:
        return None
    bins = histogram_bins(row.counts, row.first, edges, low, high)
    if bins is None or not row.signed:
        return bins
    counts: list[int] = []
    bounds = [bins[1][0]]
    for count, upper in zip(bins[0], bins[1][1:], strict=True):
        if count or not counts or counts[-1]:
            counts.append(count)
            bounds.append(upper)
        else:  # an empty bin after an empty bin: the two as one
            bounds[-1] = upper
    return counts, bounds


def value_bounds(
    chunk: StatsRows, info: RunInfo | None
) -> tuple[list[float | None], list[float | None]]:
    """Each row's smallest and largest value in its histogram's terms, for open-ended bins.

    A log2 histogram counts magnitudes: from 0 to ``absmax``. A linear one counts values,
    and so does a log2 one split by sign: from ``min`` to ``max``. None where the row lacks
    the statistic.
    """
    histogram = (info.config.get("histogram") if info is not None else None) or {}
    columns = chunk.columns()
    rows = len(chunk)
    if histogram.get("kind") == "log2" and chunk.negative is None:
        low: list[float | None] = [0.0] * rows
        high = _floats(columns.get("absmax"), rows)
    else:
        low, high = _floats(columns.get("min"), rows), _floats(columns.get("max"), rows)
    return low, high


def _floats(column: Any, rows: int) -> list[float | None]:
    if column is None:
        return [None] * rows
    return [None if value is None else float(value) for value in as_list(column)]


def _width(edges: Sequence[float], slot: int, fallback: float) -> float:
    """Width of ``slot`` where both its edges are finite; else ``|fallback|`` or 1."""
    if 0 <= slot < len(edges) - 1:
        width = edges[slot + 1] - edges[slot]
        if math.isfinite(width) and width > 0:
            return float(width)
    return abs(fallback) or 1.0


def as_list(column: Any) -> list[Any]:
    """A tensor column's values, or a list column as it is."""
    return column.tolist() if hasattr(column, "tolist") else list(column)
