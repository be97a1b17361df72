"""The ``stats=`` argument: which built-in statistics to keep and which custom ones to add."""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from torch import Tensor

from layerscope.stats._finalize import BUILTIN_STATS

#: A custom statistic: takes the detached tensor as recorded, returns a scalar or 1-D tensor.
CustomStat = Callable[[Tensor], "Tensor | float | int"]

# Columns a custom statistic may not shadow.
_RESERVED = frozenset(
    (
        "step",
        "phase",
        "rank",
        "module",
        "module_type",
        "kind",
        "tensor",
        "call",
        "dtype",
        "shape",
        "numel",
        *BUILTIN_STATS,
    )
)


@dataclass(frozen=True, slots=True)
class StatSelection:
    """Built-in statistics to report, in order, and custom statistics by name."""

    builtin: tuple[str, ...] = BUILTIN_STATS
    custom: Mapping[str, CustomStat] = field(default_factory=dict)


def parse_stats(stats: object) -> StatSelection:
    """Validate ``stats=``: None, names of built-ins, ``{name: fn}``, or a list of both.

    Names select built-in statistics (``hist`` included); a mapping adds custom statistics to
    the defaults, or to the names listed beside it.

    Example:
        >>> parse_stats(["mean", "std"]).builtin
        ('mean', 'std')
        >>> sorted(parse_stats({"rms": lambda t: t.float().pow(2).mean().sqrt()}).custom)
        ['rms']
    """
    if stats is None:
        return StatSelection()
    if isinstance(stats, str) or callable(stats):
        raise TypeError(
            f"stats: expected a list of statistic names and/or a dict of name -> callable, "
            f"got {stats!r}"
        )
    items = [stats] if isinstance(stats, Mapping) else list(_iterate(stats))
    names: list[str] = []
    custom: dict[str, CustomStat] = {}
    for item in items:
        if isinstance(item, str):
            if item not in BUILTIN_STATS:
                raise ValueError(
                    f"stats: unknown statistic {item!r}; built-in ones are "
                    f"{', '.join(BUILTIN_STATS)} (custom ones go in a dict of name -> callable)"
                )
            if item not in names:
                names.append(item)
        elif isinstance(item, Mapping):
            for name, fn in item.items():
                _check_custom(name, fn)
                custom[name] = fn
        else:
            raise TypeError(f"stats: expected a statistic name or a dict, got {item!r}")
    only_custom = not names
    builtin = BUILTIN_STATS if only_custom else tuple(n for n in BUILTIN_STATS if n in names)
    return StatSelection(builtin=builtin, custom=custom)


def _iterate(stats: object) -> list[object]:
    try:
        return list(cast(Iterable[object], stats))  # any iterable is welcome
    except TypeError:
        raise TypeError(
            f"stats: expected a list of statistic names and/or a dict of name -> callable, "
            f"got {stats!r}"
        ) from None


def _check_custom(name: object, fn: object) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"stats: a custom statistic needs an identifier as name, got {name!r}")
    if name in _RESERVED:
        raise ValueError(f"stats: custom statistic {name!r} would shadow a built-in column")
    if not callable(fn):
        raise TypeError(f"stats: custom statistic {name!r} must be callable, got {fn!r}")
