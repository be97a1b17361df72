"""The ``stats=`` argument: which built-in statistics to keep and which custom ones to add.

Custom statistics are given for every kind (``{name: fn}``), or for some kinds only
(``{"activation": {name: fn}, "weight": {name: fn}}``), or both; built-in ones are chosen for
every kind.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from layerscope.model import KEY_COLUMNS, META_COLUMNS, Kind
from layerscope.stats._formats import PRECISION_STATS

if TYPE_CHECKING:
    from torch import Tensor

#: The built-in statistics, in column order. ``hist`` comes from the histogram, the rest from
#: the partials row.
BUILTIN_STATS = (
    "mean",
    "std",
    "min",
    "max",
    "absmax",
    "l2",
    "zero_frac",
    "neg_frac",
    "pos_frac",
    "nan_count",
    "inf_count",
    *PRECISION_STATS,  # per low-precision format: e4m3_over, e4m3_under, e4m3_scale_exp, ...
    "hist",
)

#: A custom statistic: takes the detached tensor as recorded, returns a scalar or 1-D tensor.
CustomStat = Callable[["Tensor"], "Tensor | float | int"]

# Columns of the stored stats table that no ``StatsRows`` holds: Parquet keeps a histogram's counts
# trimmed, from slot ``hist_lo`` on (store/_arrow.py, which imports pyarrow, so not from there).
_STORE_COLUMNS = ("hist_lo",)


@dataclass(frozen=True, slots=True)
class StatSelection:
    """Built-in statistics to report, in order, and custom statistics by name.

    ``custom`` are computed for every kind, ``by_kind[kind]`` for that kind only (a name in
    both: the kind's own function). Each custom name is one column of the stats table; rows
    of a kind that does not compute it hold null there.
    """

    builtin: tuple[str, ...] = BUILTIN_STATS
    custom: Mapping[str, CustomStat] = field(default_factory=dict)
    by_kind: Mapping[str, Mapping[str, CustomStat]] = field(default_factory=dict)

    @property
    def custom_columns(self) -> tuple[str, ...]:
        """Every custom statistic's name, once: those of every kind first, then per kind."""
        names = dict.fromkeys(self.custom)
        for stats in self.by_kind.values():
            names.update(dict.fromkeys(stats))
        return tuple(names)

    def for_kind(self, kind: str) -> Mapping[str, CustomStat]:
        """The custom statistics of rows of ``kind``: ``custom``, the kind's own over them."""
        own = self.by_kind.get(kind)
        return {**self.custom, **own} if own else self.custom


def parse_stats(stats: object) -> StatSelection:
    """Validate ``stats=``: None, a name, names of built-ins, ``{name: fn}``, or a list of both.

    None keeps every built-in statistic. Names select built-in statistics (``hist``
    included); one name may be given as a string. A mapping adds custom statistics to the
    defaults, or to the names listed beside it. A mapping of kind names to such mappings
    (``{"activation": {"rms": fn}}``) adds them to that kind's rows only; a kind it does not
    name gets the built-ins and the custom statistics given for every kind, if any. An empty
    list selects nothing and is refused.

    Examples:
        >>> parse_stats(["mean", "std"]).builtin
        ('mean', 'std')
        >>> parse_stats("absmax").builtin
        ('absmax',)
        >>> sorted(parse_stats({"rms": lambda t: t.float().pow(2).mean().sqrt()}).custom)
        ['rms']
        >>> per_kind = parse_stats({"weight": {"norm": lambda t: t.norm()}})
        >>> per_kind.custom_columns, sorted(per_kind.for_kind("weight")), per_kind.for_kind("grad")
        (('norm',), ['norm'], {})
    """
    if stats is None:
        return StatSelection()
    if callable(stats):
        raise TypeError(
            f"stats: expected a list of statistic names and/or a dict of name -> callable, "
            f"got {stats!r}"
        )
    if isinstance(stats, str | Mapping):
        items: list[object] = [stats]  # one name, not its letters
    else:
        items = _iterate(stats)
    if not items:
        raise ValueError(
            "stats: expected at least one statistic, got none (stats=None keeps every built-in one)"
        )
    names: list[str] = []
    custom: dict[str, CustomStat] = {}
    by_kind: dict[str, dict[str, CustomStat]] = {}
    for item in items:
        if isinstance(item, str):
            if item not in BUILTIN_STATS:
                raise ValueError(
                    f"stats: unknown statistic {item!r}; built-in ones are "
                    f"{', '.join(BUILTIN_STATS)} (custom ones go in a dict of name -> callable)"
                )
            if item not in names:
                names.append(item)
        elif isinstance(item, Mapping) and _is_per_kind(item):
            _parse_per_kind(item, by_kind, custom)
        elif isinstance(item, Mapping):
            for name, fn in item.items():
                _check_custom(name, fn, _all_custom(custom, by_kind))
                custom[name] = fn
        else:
            raise TypeError(f"stats: expected a statistic name or a dict, got {item!r}")
    only_custom = not names
    builtin = BUILTIN_STATS if only_custom else tuple(n for n in BUILTIN_STATS if n in names)
    return StatSelection(builtin=builtin, custom=custom, by_kind=by_kind)


def _is_per_kind(mapping: Mapping[object, object]) -> bool:
    """Whether ``mapping`` maps kinds to statistics (some value is a dict), not names to fns."""
    return any(isinstance(value, Mapping) for value in mapping.values())


def _parse_per_kind(
    mapping: Mapping[object, object],
    by_kind: dict[str, dict[str, CustomStat]],
    custom: Mapping[str, CustomStat],
) -> None:
    """Check ``{kind: {name: fn}}`` and add it to ``by_kind``."""
    kinds = [kind.value for kind in Kind]
    for kind, stats in mapping.items():
        if kind not in kinds:
            raise ValueError(
                f"stats: unknown kind {kind!r} in a dict of statistics per kind; kinds are "
                f"{', '.join(kinds)} (custom statistics for every kind go in a dict of "
                f"name -> callable beside it)"
            )
        if not isinstance(stats, Mapping):
            raise TypeError(
                f"stats[{kind!r}]: expected a dict of name -> callable, got {stats!r} "
                f"(built-in statistics are chosen for every kind: "
                f"stats=['mean', {{{kind!r}: {{...}}}}])"
            )
        own = by_kind.setdefault(str(kind), {})
        for name, fn in stats.items():
            _check_custom(name, fn, _all_custom(custom, by_kind))
            own[name] = fn


def _all_custom(
    custom: Mapping[str, CustomStat], by_kind: Mapping[str, Mapping[str, CustomStat]]
) -> dict[str, CustomStat]:
    """Every custom statistic given so far, by name (for checks of a new name)."""
    every = dict(custom)
    for stats in by_kind.values():
        every.update(stats)
    return every


def _iterate(stats: object) -> list[object]:
    try:
        return list(cast(Iterable[object], stats))  # any iterable is welcome
    except TypeError:
        raise TypeError(
            f"stats: expected a list of statistic names and/or a dict of name -> callable, "
            f"got {stats!r}"
        ) from None


def _table_columns() -> frozenset[str]:
    """Every column of the stats table but the custom statistics, which may not reuse one."""
    return frozenset((*KEY_COLUMNS, *META_COLUMNS, *BUILTIN_STATS, *_STORE_COLUMNS))


def is_custom_stat_name(name: object) -> bool:
    """Whether ``name`` may name a custom statistic's column.

    It must be an identifier, not a keyword, and no other column of the stats table (SQL
    compares names without case): watch() checks it, and so does a reader of run.json.

    Examples:
        >>> is_custom_stat_name("grad_ratio"), is_custom_stat_name("x; drop table stats")
        (True, False)
        >>> is_custom_stat_name("Mean")
        False
    """
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and name.lower() not in _table_columns()
    )


def _check_custom(name: object, fn: object, earlier: Mapping[str, CustomStat]) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"stats: a custom statistic needs an identifier as name, got {name!r}")
    # SQL names are case-insensitive: in run.sql a custom 'Mean' would read as 'mean'.
    folded = name.lower()
    if folded in _table_columns():
        raise ValueError(
            f"stats: custom statistic {name!r} would clash with the stats table's column "
            f"{folded!r}; give it another name"
        )
    clash = next((other for other in earlier if other.lower() == folded), None)
    if clash is not None and clash != name:
        raise ValueError(
            f"stats: custom statistics {clash!r} and {name!r} differ only in case, "
            f"which SQL does not tell apart"
        )
    if not callable(fn):
        raise TypeError(f"stats: custom statistic {name!r} must be callable, got {fn!r}")
