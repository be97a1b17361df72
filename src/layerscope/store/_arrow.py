"""Records as Arrow tables and back.

Histograms are stored trimmed: ``hist`` holds the counts from the first to the last non-zero
slot and ``hist_lo`` the slot of its first element. A 256-slot log2 histogram of a real
tensor spans a few dozen slots, so this keeps the store small; readers widen it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from layerscope.model import CallEvent, Identities
from layerscope.stats import PRECISION_COUNTS, check_fits
from layerscope.store._arrays import float_lists, floats, lists, numeric, strings

if TYPE_CHECKING:
    from layerscope.health import Alert
    from layerscope.model import AttentionRow, StatsRows

# The statistics that are counts; the others are float64.
_COUNT_STATS = frozenset(("numel", "nan_count", "inf_count", *PRECISION_COUNTS))

# Every table but stats gets a ``rank`` column last (the stats table has it among its keys);
# files written before it was added lack it, and are read as rank 0's.
SCALARS_SCHEMA = pa.schema(
    [("step", pa.int64()), ("name", pa.string()), ("value", pa.float64()), ("rank", pa.int32())]
)
ALERTS_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("phase", pa.string()),
        ("rule", pa.string()),
        ("module", pa.string()),
        ("kind", pa.string()),
        ("tensor", pa.string()),
        ("severity", pa.string()),
        ("value", pa.float64()),
        ("threshold", pa.float64()),
        ("message", pa.string()),
        ("rank", pa.int32()),
    ]
)
CALLS_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("seq", pa.int64()),
        ("event", pa.string()),
        ("module", pa.string()),
        ("call", pa.int32()),
        ("rank", pa.int32()),
    ]
)
ATTENTION_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("phase", pa.string()),
        ("module", pa.string()),
        ("call", pa.int32()),
        ("head", pa.int32()),
        ("keys", pa.int64()),
        ("entropy_mean", pa.float64()),
        ("entropy_min", pa.float64()),
        ("entropy_frac", pa.float64()),
        ("max_prob", pa.float64()),
        ("rank", pa.int32()),
    ]
)


def stats_schema(stats: Sequence[str], custom: Sequence[str], histogram: bool) -> pa.Schema:
    """The columns of a stats table, as a reader shows them before widening histograms.

    ``stats`` names the built-in statistics kept (``hist`` among them or not), ``custom`` the
    custom ones; ``histogram`` says whether histograms were recorded. A custom statistic that
    returns several values is a list column in the files; here it is float64.
    """
    fields = [
        ("step", pa.int64()),
        ("phase", pa.string()),
        ("rank", pa.int32()),
        ("module", pa.string()),
        ("module_type", pa.string()),
        ("kind", pa.string()),
        ("tensor", pa.string()),
        ("call", pa.int32()),
        ("sentinel", pa.bool_()),
        ("dtype", pa.string()),
        ("shape", pa.list_(pa.int64())),
        ("shard", pa.string()),
        ("numel", pa.int64()),
    ]
    for name in stats:
        if name != "hist" and name != "numel":
            fields.append((name, pa.int64() if name in _COUNT_STATS else pa.float64()))
    fields += [(name, pa.float64()) for name in custom]
    if histogram and "hist" in stats:
        fields += [("hist_lo", pa.int16()), ("hist", pa.list_(pa.int64()))]
    return pa.schema(fields)


def stats_table(chunk: StatsRows) -> pa.Table:
    """One chunk of finalised statistics as an Arrow table.

    String key columns are dictionary arrays: each identity's and form's index into a column's
    distinct values is built once per new identity, and a chunk's column is that index looked
    up by code, with no string copied per row. Parquet writes such columns as they are.
    """
    lookup = _identity_lookup(chunk.identities)
    identity, form = chunk.identity.numpy(), chunk.form.numpy()
    arrays: dict[str, pa.Array] = {"step": numeric(chunk.step.numpy(), pa.int64())}
    for name in ("phase", "rank", "module", "module_type", "kind", "tensor", "call"):
        if name == "rank":
            arrays[name] = numeric(np.full(len(chunk), chunk.rank), pa.int32())
        elif name == "call":
            arrays[name] = numeric(lookup.calls[identity], pa.int32())
        else:
            arrays[name] = lookup.column(name, identity)
    arrays["sentinel"] = numeric(np.full(len(chunk), chunk.sentinel), pa.bool_())
    arrays["dtype"] = lookup.column("dtype", form)
    arrays["shape"] = lookup.shape_column(form)
    arrays["shard"] = lookup.shard_column(form)
    for name, column in chunk.stats.items():
        kind = pa.int64() if name in _COUNT_STATS else pa.float64()
        arrays[name] = numeric(column.numpy(), kind)
    for name, values in chunk.custom.items():
        arrays[name] = _custom_array(values)
    if chunk.hist is not None:
        valid = lookup.has_histogram[form]
        arrays["hist_lo"], arrays["hist"] = _trimmed_histogram(chunk.hist.numpy(), valid)
    return pa.table(arrays)


class _Lookup:
    """Per identity (or form) code: its index into each key column's distinct values."""

    def __init__(self, identities: Identities, count: tuple[int, int]) -> None:
        rows, forms = identities.identities[: count[0]], identities.forms[: count[1]]
        values: dict[str, list[str]] = {
            "phase": [row.phase for row in rows],
            "module": [row.module for row in rows],
            "module_type": [row.module_type for row in rows],
            "kind": [row.kind.value for row in rows],
            "tensor": [row.tensor for row in rows],
            "dtype": [form.dtype for form in forms],
        }
        self._columns = {name: _encode(column) for name, column in values.items()}
        # Shards of a sharded tensor ("i/n"); None for a whole tensor, null in the file.
        shards = [form.shard for form in forms]
        self._shard_valid = np.array([shard is not None for shard in shards], dtype=bool)
        self._shards = _encode([shard or "" for shard in shards])
        self.calls = np.array([row.call for row in rows], dtype=np.int32)
        # Every form's dimensions end to end, and where each form's begin.
        self._dims = np.array([dim for form in forms for dim in form.shape], dtype=np.int64)
        self._ranks = np.array([len(form.shape) for form in forms], dtype=np.int64)
        self._starts = np.cumsum(self._ranks) - self._ranks
        self.has_histogram = np.array([form.has_histogram for form in forms], dtype=bool)

    def shape_column(self, forms: np.ndarray) -> pa.ListArray:
        """Each row's shape, gathered with numpy: a take on a list array costs far more."""
        ranks = self._ranks[forms]
        offsets = np.zeros(len(forms) + 1, dtype=np.int32)
        np.cumsum(ranks, out=offsets[1:])
        positions = np.repeat(self._starts[forms] - offsets[:-1], ranks)
        positions += np.arange(len(positions))
        dims = numeric(self._dims[positions], pa.int64())
        return lists(offsets, dims)

    def shard_column(self, forms: np.ndarray) -> pa.DictionaryArray:
        """Each row's shard, null where the tensor was whole."""
        index, dictionary = self._shards
        valid = self._shard_valid[forms]
        return pa.DictionaryArray.from_arrays(numeric(index[forms], pa.int32(), valid), dictionary)

    def column(self, name: str, codes: np.ndarray) -> pa.DictionaryArray:
        index, dictionary = self._columns[name]
        return pa.DictionaryArray.from_arrays(numeric(index[codes], pa.int32()), dictionary)


def _encode(values: list[str]) -> tuple[np.ndarray, pa.Array]:
    """Each value's index into the distinct values, and those values."""
    distinct: dict[str, int] = {}
    index = np.array([distinct.setdefault(value, len(distinct)) for value in values], np.int32)
    return index, strings(list(distinct))


def _identity_lookup(identities: Identities) -> _Lookup:
    """The lookup of every identity and form so far, rebuilt when new ones appeared."""
    count = (len(identities.identities), len(identities.forms))
    cached = identities.cache.get("arrow")
    if cached is not None and cached[0] == count:
        lookup: _Lookup = cached[1]
        return lookup
    lookup = _Lookup(identities, count)
    identities.cache["arrow"] = (count, lookup)
    return lookup


def _custom_array(values: Sequence[Any]) -> pa.Array:
    if any(isinstance(value, list) for value in values):
        return float_lists(values)
    return floats(values)


def _trimmed_histogram(counts: np.ndarray, valid: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """``(hist_lo, hist)`` arrays: each row's counts from its first to last non-zero slot.

    Histogram rows are wide (256 slots) and mostly zero, so the search for the first and last
    non-zero slot runs on the mask packed into bits, and only the windows are gathered.
    """
    rows, slots = counts.shape
    packed = np.packbits(counts != 0, axis=1)  # (rows, slots / 8), first slot in the top bit
    occupied = packed != 0
    has_any = occupied.any(axis=1) & valid
    index = np.arange(rows)
    first_byte = occupied.argmax(axis=1)
    last_byte = packed.shape[1] - 1 - occupied[:, ::-1].argmax(axis=1)
    lo = first_byte * 8 + _LEADING_ZEROS[packed[index, first_byte]]
    hi = last_byte * 8 + 8 - _TRAILING_ZEROS[packed[index, last_byte]]
    lo = np.where(has_any, lo, 0)
    lengths = np.where(has_any, np.minimum(hi, slots) - lo, 0)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    # Flat position of each kept slot: its place in the output plus its row's shift.
    positions = np.repeat(index * slots + lo - offsets[:-1], lengths)
    positions += np.arange(len(positions))
    values = numeric(counts.reshape(-1)[positions], pa.int64())
    return numeric(lo, pa.int16(), valid), lists(offsets, values, valid)


def _zero_bits_table() -> tuple[np.ndarray, np.ndarray]:
    """Leading and trailing zero bits of every byte (8 for the zero byte)."""
    leading = np.full(256, 8, dtype=np.int64)
    trailing = np.full(256, 8, dtype=np.int64)
    for byte in range(1, 256):
        leading[byte] = 8 - byte.bit_length()
        trailing[byte] = (byte & -byte).bit_length() - 1
    return leading, trailing


_LEADING_ZEROS, _TRAILING_ZEROS = _zero_bits_table()


def widened_histograms(lo: Any, hist: Any, slots: int) -> list[np.ndarray | None]:
    """Full count arrays of ``slots`` slots from the trimmed Arrow columns ``hist_lo``, ``hist``.

    Each row's array is a row of one 2-D array, filled in one scatter with no Python loop;
    for a million rows nearly all the time is the 2 GB of zeroed pages the counts need. None
    where a row has none.

    Raises:
        ValueError: a histogram does not fit in ``slots`` slots (a damaged file).
    """
    hist = hist.combine_chunks() if hasattr(hist, "combine_chunks") else hist
    lo = lo.combine_chunks() if hasattr(lo, "combine_chunks") else lo
    rows = len(hist)
    valid = np.asarray(hist.is_valid()) & np.asarray(lo.is_valid())
    offsets = np.asarray(hist.offsets, dtype=np.int64)
    lengths = np.where(valid, np.diff(offsets), 0)
    starts = np.asarray(lo.fill_null(0), dtype=np.int64)
    # The first row that does not fit is the one named, as a reader meets it.
    misfit = valid & ((starts < 0) | (starts + lengths > slots))
    if misfit.any():
        row = int(np.argmax(misfit))
        check_fits(int(starts[row]), int(lengths[row]), slots)
    counts = np.asarray(hist.values.fill_null(0), dtype=np.int64)
    owner = np.repeat(np.arange(rows), lengths)  # each count's row, and its place in it
    within = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    full = np.zeros((rows, slots), dtype=np.int64)
    full[owner, starts[owner] + within] = counts[np.repeat(offsets[:-1], lengths) + within]
    widened: list[np.ndarray | None] = list(full)  # views of its rows
    for missing in np.flatnonzero(~valid):
        widened[missing] = None
    return widened


def shape_tuples(shapes: Any) -> list[tuple[int, ...] | None]:
    """A column of shapes (integer arrays, as pandas has a list column) as tuples, as in memory.

    A run has few distinct shapes: each is made once and shared by the rows that have it.
    """
    made: dict[bytes, tuple[int, ...]] = {}

    def shared(shape: Any) -> tuple[int, ...]:
        key = np.asarray(shape, dtype=np.int64).tobytes()
        known = made.get(key)
        if known is None:
            known = made[key] = tuple(map(int, shape))
        return known

    return [None if shape is None else shared(shape) for shape in shapes]


def scalars_table(rows: list[tuple[int, str, float]], rank: int) -> pa.Table:
    """Scalars of rank ``rank`` as an Arrow table."""
    steps, names, values = zip(*rows, strict=True) if rows else ((), (), ())
    columns = [
        numeric(np.array(steps), pa.int64()),
        strings(names),
        floats(values),
        numeric(np.full(len(rows), rank), pa.int32()),
    ]
    return pa.table(columns, schema=SCALARS_SCHEMA)


def alerts_table(alerts: list[Alert], rank: int) -> pa.Table:
    """Alerts of rank ``rank`` as an Arrow table."""
    columns = [
        numeric(np.array([a.step for a in alerts], dtype=np.int64), pa.int64()),
        strings([a.phase for a in alerts]),
        strings([a.rule for a in alerts]),
        strings([a.module for a in alerts]),
        strings([a.kind for a in alerts]),
        strings([a.tensor for a in alerts]),
        strings([a.severity for a in alerts]),
        floats([a.value for a in alerts]),
        floats([a.threshold for a in alerts]),
        strings([a.message for a in alerts]),
        numeric(np.full(len(alerts), rank), pa.int32()),
    ]
    return pa.table(columns, schema=ALERTS_SCHEMA)


def calls_table(calls: list[CallEvent], rank: int) -> pa.Table:
    """The call orders of rank ``rank`` as an Arrow table."""
    columns = [
        numeric(np.array([c.step for c in calls]), pa.int64()),
        numeric(np.array([c.seq for c in calls]), pa.int64()),
        strings([c.event for c in calls]),
        strings([c.module for c in calls]),
        numeric(np.array([c.call for c in calls]), pa.int32()),
        numeric(np.full(len(calls), rank), pa.int32()),
    ]
    return pa.table(columns, schema=CALLS_SCHEMA)


def attention_table(rows: Sequence[AttentionRow], rank: int) -> pa.Table:
    """Attention rows of rank ``rank`` as an Arrow table."""
    columns = [
        numeric(np.array([r.step for r in rows], dtype=np.int64), pa.int64()),
        strings([r.phase for r in rows]),
        strings([r.module for r in rows]),
        numeric(np.array([r.call for r in rows], dtype=np.int64), pa.int32()),
        numeric(np.array([r.head for r in rows], dtype=np.int64), pa.int32()),
        numeric(np.array([r.keys for r in rows], dtype=np.int64), pa.int64()),
        floats([r.entropy_mean for r in rows]),
        floats([r.entropy_min for r in rows]),
        floats([r.entropy_frac for r in rows]),
        floats([r.max_prob for r in rows]),
        numeric(np.full(len(rows), rank), pa.int32()),
    ]
    return pa.table(columns, schema=ATTENTION_SCHEMA)
