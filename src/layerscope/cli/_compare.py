"""Two runs' rows of one step, matched by module, kind, tensor and call, and compared.

Pure functions of the rows: the ``diff`` command reads them, this decides what differs most.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas

#: What is compared of each kind: the sizes that tell a layer apart, as the summary shows
#: them. ``nonfinite`` (NaN and Inf values) is compared for every kind, where a run has any.
COMPARED = {
    "activation": ("std", "absmax", "zero_frac"),
    "input": ("std", "absmax"),
    "grad": ("l2",),
    "weight": ("l2",),
    "weight_grad": ("l2",),
    "update": ("l2",),
    "buffer": ("mean", "l2"),
}
_OTHER_KINDS = ("std", "absmax")

Key = tuple[str, str, str, int]  # module, kind, tensor, call


@dataclass(frozen=True, slots=True)
class Difference:
    """One statistic of one tensor in runs A and B, and how far B is from A."""

    module: str
    kind: str
    tensor: str
    call: int
    stat: str
    a: float
    b: float

    @property
    def relative(self) -> float:
        """``(b - a) / |a|``; see ``relative_difference``."""
        return relative_difference(self.a, self.b)


@dataclass(frozen=True, slots=True)
class Comparison:
    """The differences, the most different layer's first, and the rows only one run has."""

    differences: list[Difference]
    only_a: list[Key]
    only_b: list[Key]


def relative_difference(a: float, b: float) -> float:
    """How far ``b`` is from ``a``, relative to ``a``: ``(b - a) / |a|``.

    Equal values (NaN and NaN too) differ by 0; a value against a NaN, an Inf or a zero by
    an infinite amount, so that they come first.

    Examples:
        >>> relative_difference(2.0, 3.0), relative_difference(2.0, 1.0)
        (0.5, -0.5)
        >>> relative_difference(0.0, 0.0), relative_difference(0.0, -1.0)
        (0.0, -inf)
        >>> relative_difference(float("nan"), float("nan")), relative_difference(1.0, float("nan"))
        (0.0, inf)
    """
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    if a == 0:
        return math.copysign(math.inf, b)
    return (b - a) / abs(a)


def compare(
    rows_a: pandas.DataFrame,
    rows_b: pandas.DataFrame,
    recorded: frozenset[str],
    module_order: Sequence[str],
) -> Comparison:
    """Match the rows of one step of two runs and compare their statistics.

    Args:
        rows_a: ``_queries.rows_at_step`` of run A.
        rows_b: the same of run B.
        recorded: the statistics both runs recorded.
        module_order: modules in model order, to order layers that differ equally.

    Returns:
        A ``Comparison``: the layers (modules) by their largest relative difference, the
        largest first, and each layer's rows by theirs.
    """
    by_key_a, by_key_b = _by_key(rows_a), _by_key(rows_b)
    differences = []
    for key in sorted(by_key_a.keys() & by_key_b.keys()):
        module, kind, tensor, call = key
        for stat in (*COMPARED.get(kind, _OTHER_KINDS), "nonfinite"):
            if stat not in recorded:
                continue
            a, b = _value(by_key_a[key][stat]), _value(by_key_b[key][stat])
            if stat == "nonfinite" and a == b == 0:
                continue  # no NaN or Inf in either: nothing to show
            differences.append(Difference(module, kind, tensor, call, stat, a, b))
    return Comparison(
        differences=_most_different_first(differences, module_order),
        only_a=sorted(by_key_a.keys() - by_key_b.keys()),
        only_b=sorted(by_key_b.keys() - by_key_a.keys()),
    )


def _by_key(rows: pandas.DataFrame) -> dict[Key, dict[str, Any]]:
    return {
        (str(row["module"]), str(row["kind"]), str(row["tensor"]), int(row["call"])): row
        for row in rows.to_dict("records")
    }


def _value(value: object) -> float:
    """A statistic as a float; NaN where the run has none (null)."""
    return math.nan if value is None else float(value)  # type: ignore[arg-type]  # a number


def _most_different_first(
    differences: list[Difference], module_order: Sequence[str]
) -> list[Difference]:
    position = {module: index for index, module in enumerate(module_order)}
    largest: dict[str, float] = {}
    for difference in differences:
        size = abs(difference.relative)
        largest[difference.module] = max(largest.get(difference.module, 0.0), size)

    def order(difference: Difference) -> tuple[float, int, str, float]:
        module = difference.module
        return (
            -largest[module],
            position.get(module, len(position)),
            module,
            -abs(difference.relative),
        )

    return sorted(differences, key=order)  # stable: equal rows keep kind, tensor, stat order
