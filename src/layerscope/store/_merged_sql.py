"""The ranks' stored rows merged into whole-job rows, in SQL: the view ``merged_stats``.

DuckDB computes the merge (``load(path, ranks="merge")``, ``run.sql("... from merged_stats")``)
out of the Parquet files, so a run of tens of millions of rows merges in bounded memory. The
stored statistics are enough to merge exactly (up to float64 rounding), as the live merge does
(``layerscope.writer._rank_merge``):

- forward and backward kinds merge over ranks; a parameter kind merges only where it was
  sharded (its rows have a ``shard``, and the merged row the whole parameter's shape), and is
  the lowest rank's otherwise, as a replicated parameter is the same on every rank;
- counts, ``numel`` and histograms add up; extremes are the extremes; ``l2`` is the root of the
  summed squares; fractions and custom statistics are numel-weighted means;
- mean and std are those of the finite elements, by Chan et al.'s parallel formula: the finite
  count is ``numel - nan_count - inf_count``, ``M2 = std**2 (count - 1)``, and each part adds
  ``count (mean - c)**2``, less ``total (merged mean - c)**2``: exact for any ``c`` the
  group's rows share, and stable for one near their mean. ``c`` is the mean over a window
  partitioned by step, module, kind and a hash of the group's keys (two groups of one hash
  only move ``c`` off their means): a filter on step, module or kind reaches the files
  before the window (one module's series of 50 M rows in 2 s, where all of them take 30), and
  the other keys sort as one integer. A query that names neither ``std`` nor ``mean`` is
  spared the window (DuckDB drops what nothing uses), where a join of the means would cost
  every query. Summing squares about zero instead would lose every digit of a small spread
  about a large mean;
- a format's scale exponent is the one that fits the merged ``absmax``.

NaN statistics (a tensor with no finite element) are left out as missing ones are. Every name
in the SQL is the code's own or a column name quoted as an identifier: a custom statistic's
name read from ``run.json`` never becomes SQL text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from layerscope.model import STATE_KINDS, ModuleInfo, quote_identifier
from layerscope.stats import FORMATS, PRECISION_COUNTS
from layerscope.store._sql import WRITTEN_STATS

#: The view of merged rows, beside ``stats``.
MERGED_VIEW = "merged_stats"
#: The whole shape of each parameter (module, tensor, shape): a table made with the views.
SHAPES_TABLE = "merged_parameter_shapes"

_KEYS = ("step", "phase", "module", "module_type", "kind", "tensor", "call")
_FRACTIONS = ("zero_frac", "neg_frac", "pos_frac")
_COUNTS = ("nan_count", "inf_count", *PRECISION_COUNTS)
_EXTREMES = {"min": "min", "max": "max", "absmax": "max"}
_SCALES = {fmt.scale_exp: fmt for fmt in FORMATS}
# The columns the merge adds to a row on its way, named as no column of a run can be (a
# custom statistic's name is an identifier): a custom "_finite" is merged as any other.
_FINITE, _HASH, _SHIFT, _SHARDED, _WRITTEN_AT = (
    '"layerscope.finite"',
    '"layerscope.hash"',
    '"layerscope.shift"',
    '"layerscope.sharded"',
    '"layerscope.written"',
)
_MERGED_MEAN = (
    f"(sum({_FINITE} * coalesce(nullif(mean, 'nan'::double), 0)) / nullif(sum({_FINITE}), 0))"
)
# Statistics a group of one row keeps as stored: merging one part would only round them.
_ONE_PART_KEPT = frozenset(("mean", "std", "l2", *_FRACTIONS))
_STATE = ", ".join(f"'{kind.value}'" for kind in sorted(STATE_KINDS))


def merging_inputs(
    meta: dict[str, Any], modules: Sequence[ModuleInfo]
) -> tuple[tuple[str, ...], list[tuple[str, str, list[int]]]]:
    """What the merge needs besides the rows: custom statistics, parameters' whole shapes.

    The custom statistics' names are ``run.json``'s (``meta``); each parameter's whole shape
    (module, tensor, shape) is the module tree's, for the merged rows of its shards.
    """
    custom = tuple(meta.get("config", {}).get("custom_stats", ()))
    shapes = [
        (info.name, name, list(shape))
        for info in modules
        for name, shape in info.parameters.items()
    ]
    return custom, shapes


def merged_view_sql(
    columns: Sequence[tuple[str, str]], custom: Iterable[str], ordered: bool = False
) -> str:
    """The query of ``merged_stats`` over the view ``stats`` whose columns are ``columns``.

    Args:
        columns: the ``stats`` view's columns, as (name, DuckDB type), in order.
        custom: the names of custom statistics (numel-weighted means).
        ordered: the rows in the order the lowest rank wrote them (read from the view
            ``stats_as_written``), as ``run.stats`` hands them over; a view's rows have no
            order, and sorting them would cost every query.

    Returns:
        A ``select`` with the columns of ``stats``, in their order, one row per step,
        phase, module, kind, tensor and call, ``rank`` 0.
    """
    names = [name for name, _ in columns]
    types = dict(columns)
    custom = set(custom)
    parts = {name: _merged(name, types[name], name in custom) for name in names}
    if "std" in types and "mean" not in types:  # no mean to merge it about: as stored
        parts["std"] = "arg_min(std, rank)"
    for name in _ONE_PART_KEPT.intersection(names):  # one rank's row: its values exactly
        parts[name] = f"case when count(*) = 1 then any_value({_q(name)}) else {parts[name]} end"
    if "hist" in types and "hist_lo" in types:
        parts["hist_lo"] = "min(hist_lo) filter (where hist is not null)"
        parts["hist"] = _HISTOGRAM_PARTS
    group_keys = [*(_q(key) for key in _KEYS if key in types), "coalesce(sentinel, false)"]
    aggregates = ",\n    ".join(f"{parts[name]} as {_q(name)}" for name in names)
    finals = ",\n  ".join(_final(name, types, name in custom) for name in names)
    return f"""
with kept as (
  select *, {_finite_count(types)} as {_FINITE}, hash({", ".join(group_keys)}) as {_HASH}
  from {WRITTEN_STATS if ordered else "stats"}
  where not (kind in ({_STATE}) and shard is null)
     or rank = (select min(rank) from stats)
), centred as (
  select *, {_shift(types)} as {_SHIFT}
  from kept
  window part as (partition by step, module, kind, {_HASH})
), grouped as (
  select
    {aggregates},
    bool_or(shard is not null) as {_SHARDED}{_WRITTEN if ordered else ""}
  from centred
  group by {", ".join(group_keys)}
)
select
  {finals}
from grouped{f" order by step, {_WRITTEN_AT}" if ordered else ""}
"""


def _q(name: str) -> str:
    return quote_identifier(name)


def _finite(name: str) -> str:
    """A statistic's value, NULL where missing or NaN (no finite element to say it of)."""
    return f"nullif({_q(name)}, 'nan'::double)"


def _finite_count(types: dict[str, str]) -> str:
    """Each row's count of finite elements: what its mean and std are of (0 where none)."""
    if "mean" not in types or "numel" not in types:
        return "0::double"
    count = "numel"
    for name in ("nan_count", "inf_count"):
        if name in types:
            count += f" - coalesce({name}, 0)"
    return f"case when {_finite('mean')} is null then 0 else ({count})::double end"


def _shift(types: dict[str, str]) -> str:
    """The mean of the finite elements of the rows whose keys hash alike (the window ``part``)."""
    if "mean" not in types:
        return "null::double"
    weighted = f"sum({_FINITE} * coalesce({_finite('mean')}, 0)) over part"
    return f"{weighted} / nullif(sum({_FINITE}) over part, 0)"


def _merged(name: str, kind: str, custom: bool) -> str:
    """The aggregate of column ``name`` (DuckDB type ``kind``) over one group's rows."""
    q = _q(name)
    if name in _KEYS:
        return q
    if name == "sentinel":
        return "coalesce(sentinel, false)"
    if name == "rank":
        return "0::integer"
    if name == "numel":
        return "sum(numel)::bigint"
    if name == "mean":
        return _MERGED_MEAN
    if name == "std":
        # Chan et al.: the parts' M2 and their distances from a shift the group shares.
        parts = f"coalesce({_finite('std')}, 0) ^ 2 * greatest({_FINITE} - 1, 0)"
        parts += f" + {_FINITE} * (coalesce({_finite('mean')}, 0) - coalesce({_SHIFT}, 0)) ^ 2"
        shift = f"coalesce(any_value({_SHIFT}), 0)"
        m2 = f"sum({parts}) - sum({_FINITE}) * ({_MERGED_MEAN} - {shift}) ^ 2"
        total = f"sum({_FINITE})"
        return f"case when {total} > 1 then sqrt(greatest({m2}, 0) / ({total} - 1)) end"
    if name in _EXTREMES:
        return f"{_EXTREMES[name]}({_finite(name)})"
    if name == "l2":
        return f"sqrt(sum({_finite(name)} ^ 2))"
    if name in _FRACTIONS:
        return f"sum({_finite(name)} * numel) / nullif(sum(numel), 0)"
    if name in _COUNTS:
        return f"sum({q})::bigint"
    if custom and kind.endswith("[]"):
        parts = f"list(struct_pack(v := {q}, w := greatest(numel, 1)))"
        return f"{parts} filter (where {q} is not null)"
    if custom:
        weight = "greatest(numel, 1)"
        present = f"{_finite(name)} is not null"
        return f"sum({_finite(name)} * {weight}) / sum(case when {present} then {weight} end)"
    # Any other column (a form, a scale exponent, one another program added): the lowest
    # rank's value; the scale exponents are made again from the merged absmax below.
    return f"arg_min({q}, rank)"


# Where the lowest rank wrote the row: its rank, then its place in the file of its step.
_WRITTEN = f",\n    min((rank::bigint << 32) + file_row_number) as {_WRITTEN_AT}"
# Each rank's trimmed histogram, with where it starts; added slot by slot below.
_HISTOGRAM_PARTS = (
    "list(struct_pack(lo := hist_lo, counts := hist)) filter (where hist is not null)"
)


def _final(name: str, types: dict[str, str], custom: bool) -> str:
    """Column ``name`` of a merged row, from the group's aggregates."""
    q = _q(name)
    kind = types[name]
    if name == "shard":
        return f"null::{kind} as shard"
    if name == "shape":
        whole = f"(select any_value(s.shape) from {SHAPES_TABLE} s "
        whole += "where s.module = grouped.module and s.tensor = grouped.tensor)"
        return f"case when {_SHARDED} then coalesce({whole}, shape) else shape end as shape"
    if name in _SCALES and "absmax" in types:
        return f"{_scale_exponent('absmax', _SCALES[name].max)}::{kind} as {q}"
    if name == "hist" and "hist_lo" in types:
        return f"{_histogram_sum()}::{kind} as hist"
    if custom and kind.endswith("[]"):
        return f"{_weighted_lists(q)}::{kind} as {q}"
    return q


def _histogram_sum() -> str:
    """The histograms of the group's rows added slot by slot, from the lowest slot any uses."""
    end = "list_max(list_transform(hist, lambda p: p.lo + len(p.counts)))"
    count = (
        "list_sum(list_transform(hist, lambda p: case when s >= p.lo and s < p.lo + "
        "len(p.counts) then p.counts[s - p.lo + 1] else 0 end))"
    )
    slots = f"range(hist_lo::bigint, {end})"
    return f"case when len(hist) > 0 then list_transform({slots}, lambda s: {count}) end"


def _weighted_lists(q: str) -> str:
    """A list-valued custom statistic's numel-weighted mean, element by element.

    NULL where the ranks' lists differ in length: their elements are not the same quantity.
    """
    size = f"len({q}[1].v)"
    same = f"list_bool_and(list_transform({q}, lambda p: len(p.v) = {size}))"
    weights = f"list_sum(list_transform({q}, lambda p: p.w))"
    element = f"list_sum(list_transform({q}, lambda p: p.v[i] * p.w)) / {weights}"
    return (
        f"case when len({q}) > 0 and {same} "
        f"then list_transform(range(1, {size} + 1), lambda i: {element}) end"
    )


def _scale_exponent(absmax: str, largest: float) -> str:
    """The largest k with ``absmax * 2**k <= largest`` (``stats.scale_exponent``), in SQL.

    ``frexp``'s exponent e (``2**(e-1) <= x < 2**e``) from ``log2``, corrected by one where
    rounding put it off, and its mantissa ``x / 2**e`` compared with the largest value's.
    """
    mantissa, exponent = math.frexp(largest)
    x = _q(absmax)
    guess = f"(floor(log2({x})) + 1)"
    e = (
        f"({guess} + case when {x} >= pow(2.0, {guess} - 1) * 2 then 1 "
        f"when {x} < pow(2.0, {guess} - 1) then -1 else 0 end)"
    )
    above = f"(({x} / pow(2.0, {e} - 1) / 2) > {mantissa!r})::integer"
    return f"case when {x} > 0 and {x} < 'inf'::double then {exponent} - {e} - {above} end"
