"""The summary's layers table: each layer's latest statistics per kind, and their trend."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from layerscope.cli import _format
from layerscope.cli._console import Column, Table
from layerscope.cli._layers import in_model_order, shown_name

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True, slots=True)
class Measure:
    """One statistic of one kind, as a column of the layers table."""

    kind: str
    stat: str
    header: str


#: What the summary shows unless asked for kinds: how big activations, gradients and weights
#: are, and how many activations are dead.
OVERVIEW = (
    Measure("activation", "std", "act std"),
    Measure("activation", "absmax", "act absmax"),
    Measure("activation", "zero_frac", "act zero"),
    Measure("grad", "l2", "grad l2"),
    Measure("weight", "l2", "weight l2"),
    Measure("weight_grad", "l2", "wgrad l2"),
)
_KIND_LABELS = {"activation": "act", "weight_grad": "wgrad"}
_STAT_LABELS = {"zero_frac": "zero"}
_PER_KIND = ("mean", "std", "absmax", "l2", "zero_frac")


def measures_of(kinds: Sequence[str]) -> tuple[Measure, ...]:
    """The columns for ``--kind``: mean, std, abs-max, L2 and zero fraction of each kind.

    Examples:
        >>> [m.header for m in measures_of(["update"])]
        ['update mean', 'update std', 'update absmax', 'update l2', 'update zero']
    """
    return tuple(
        Measure(kind, stat, f"{_KIND_LABELS.get(kind, kind)} {_STAT_LABELS.get(stat, stat)}")
        for kind in kinds
        for stat in _PER_KIND
    )


def layers_table(
    trends: pandas.DataFrame,
    types: dict[str, str],
    measures: Sequence[Measure],
    recorded: frozenset[str],
    title: str,
) -> Table:
    """One row per layer in model order, one column per measure, then NaN and Inf counts.

    A cell is the value at the layer's latest step of that kind, then ``x`` its ratio to the
    value at the first step (left out where a layer has one step, or a first value of 0).
    Measures no layer has are left out.

    Args:
        trends: ``_queries.layer_trends``'s frame.
        types: each module's class name, in model order.
        measures: the columns to show.
        recorded: the statistics the run recorded; the others show as ``-``.
        title: the table's title.
    """
    by_layer: dict[str, dict[str, Any]] = {}
    for record in trends.to_dict("records"):
        by_layer.setdefault(record["module"], {})[record["kind"]] = record
    shown = [m for m in measures if m.stat in recorded and _anyone_has(by_layer, m.kind)]
    # A layer with none of the kinds shown (a ReLU under --kind weight) has no row.
    kinds = {measure.kind for measure in shown}
    modules = in_model_order([m for m, of in by_layer.items() if kinds & of.keys()], types)
    columns = [
        _aligned([_cell(by_layer[module].get(measure.kind), measure.stat) for module in modules])
        for measure in shown
    ]
    table = Table(
        title,
        [
            Column("module"),
            Column("type"),
            *(Column(measure.header, numeric=True) for measure in shown),
            *([Column("nan+inf", numeric=True)] if "nonfinite" in recorded else []),
        ],
    )
    for index, module in enumerate(modules):
        cells = [shown_name(module), types.get(module, _format.MISSING)]
        cells += [column[index] for column in columns]
        nonfinite = _nonfinite(by_layer[module].values())
        if "nonfinite" in recorded:
            cells.append(nonfinite)
        table.add(cells, style="bold red" if nonfinite not in ("0", _format.MISSING) else None)
    return table


def _anyone_has(by_layer: dict[str, dict[str, Any]], kind: str) -> bool:
    return any(kind in kinds for kinds in by_layer.values())


def _cell(record: dict[str, Any] | None, stat: str) -> tuple[str, str]:
    """(value, trend) of ``stat`` in one layer's row of one kind; ``-`` if it has none."""
    if record is None:
        return _format.MISSING, ""
    latest, first = record[f"{stat}_last"], record[f"{stat}_first"]
    trend = _format.ratio(latest, first) if record["last_step"] > record["first_step"] else ""
    return _format.number(latest), trend


def _aligned(cells: list[tuple[str, str]]) -> list[str]:
    """Cells ``value trend``, trends padded to one width: values and trends line up."""
    width = max((len(trend) for _, trend in cells), default=0)
    if not width:
        return [value for value, _ in cells]
    return [f"{value} {trend.ljust(width)}" for value, trend in cells]


def _nonfinite(records: Any) -> str:
    """NaN and Inf values at each kind's latest step, all kinds together."""
    counts = [record["nonfinite_last"] for record in records]
    finite = [count for count in counts if count is not None and not math.isnan(count)]
    return _format.number(sum(finite)) if finite else _format.MISSING
