"""Which layers, steps and rows a figure shows, read from the run with only the columns it needs.

Every figure reads one rank (the lowest), call 0 of each module and no sentinel rows, so a
layer is one line or one image row; layers come in the order of ``run.modules``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.model import Kind, quote_identifier

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

    from layerscope.plots._source import RunTables

Modules = str | Sequence[str] | None

PHASES = ("train", "eval")
# The tensor a figure shows when none is named: the output for per-call kinds, the weight
# matrix for parameter kinds.
DEFAULT_TENSOR = {
    "activation": "out",
    "grad": "out",
    "input": "in.0",
    "input_grad": "in.0",
    "weight": "weight",
    "weight_grad": "weight",
    "update": "weight",
    "buffer": "running_var",
}
# Columns of the stats table that are not statistics.
_NOT_STATS = frozenset(("hist", "hist_lo"))


# The modules a query picks, bound as the list ``$names``: each row's module comes back as its
# index in that list. Names come from the run's files: never pasted into SQL.
PICKED_MODULES = (
    "(select unnest($names) as name, generate_subscripts($names, 1) - 1 as layer) picked"
)


def check_kind(kind: str) -> str:
    """``kind`` as a plain string, or a ValueError naming ``kind``."""
    value = kind.value if isinstance(kind, Kind) else kind
    if value not in DEFAULT_TENSOR:
        raise ValueError(f"kind: expected one of {sorted(DEFAULT_TENSOR)}, got {kind!r}")
    return str(value)


def check_phase(phase: str) -> str:
    """``phase``, or a ValueError naming ``phase``."""
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
    return phase


def check_stat(run: RunTables, stat: str, argument: str = "stat") -> str:
    """``stat`` if the run recorded it as a number, else a ValueError naming ``argument``."""
    config = run.meta.get("config", {})
    known = [
        name
        for name in (*config.get("stats", ()), *config.get("custom_stats", ()))
        if name not in _NOT_STATS
    ]
    if stat not in known:
        raise ValueError(f"{argument}: expected a statistic the run recorded {known}, got {stat!r}")
    return stat


def select_modules(run: RunTables, modules: Modules) -> list[str]:
    """Names of the selected modules, in model order.

    Args:
        run: the run.
        modules: None for all, a regex searched in each name, or a list of names.

    Raises:
        ValueError: a listed name is not a module of the run, or the regex matches none.
    """
    ordered = [info.name for info in run.modules]
    if modules is None:
        return ordered
    if isinstance(modules, str):
        pattern = re.compile(modules)
        chosen = [name for name in ordered if pattern.search(name)]
        if not chosen:
            raise ValueError(f"modules: {modules!r} matches no module of {ordered}")
        return chosen
    unknown = [name for name in modules if name not in ordered]
    if unknown:
        raise ValueError(f"modules: unknown modules {unknown}; the run has {ordered}")
    wanted = set(modules)
    return [name for name in ordered if name in wanted]


def read_rows(
    run: RunTables,
    columns: Sequence[str],
    *,
    kind: str,
    phase: str,
    modules: Modules,
    tensor: str | None = None,
) -> tuple[list[str], pandas.DataFrame]:
    """The selected layers that have rows, in model order, and their rows.

    Reads ``step, module`` and ``columns`` of one kind and tensor only.

    Raises:
        ValueError: for an unknown kind, phase or module, or when no selected layer has a row
            of this kind (naming ``kind``).
    """
    kind = check_kind(kind)
    phase = check_phase(phase)
    names = select_modules(run, modules)
    tensor = DEFAULT_TENSOR[kind] if tensor is None else tensor
    # Each row's module comes back as its index in ``names``, not as a string: a million
    # Python strings would cost more than the figure's numbers. Rows come unsorted (DuckDB
    # sorting a million rows costs more memory than numpy's stable argsort after).
    # ``columns`` are checked statistics (``check_stat``) or fixed names: quoted, never raw.
    wanted = ", ".join(["step", "picked.layer", *map(quote_identifier, columns)])
    frame = run.sql(
        f"select {wanted} from stats join {PICKED_MODULES} on stats.module = picked.name"
        " where kind = $kind and tensor = $tensor and phase = $phase"
        " and coalesce(call, 0) = 0 and not coalesce(sentinel, false)"
        " and rank = (select min(rank) from stats)",
        {"names": names, "kind": kind, "tensor": tensor, "phase": phase},
    )
    order = np.argsort(frame["step"].to_numpy(), kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    codes = frame.pop("layer").to_numpy(dtype=np.int64)
    frame.insert(1, "module", pandas_categorical(codes, names))
    present = set(np.unique(codes).tolist())
    layers = [name for index, name in enumerate(names) if index in present]
    if not layers:
        which = names if len(names) <= 6 else f"{len(names)} modules"
        raise ValueError(
            f"kind: no {kind!r} rows of tensor {tensor!r} in phase {phase!r} for modules {which}"
        )
    return layers, frame


def pandas_categorical(codes: np.ndarray, names: Sequence[str]) -> pandas.Categorical:
    """Module names as a Categorical over ``names``: an int per row, each name stored once."""
    import pandas

    return pandas.Categorical.from_codes(codes, categories=list(names))


def layers_with_rows(run: RunTables, *, kind: str, phase: str, tensor: str | None) -> list[str]:
    """The modules with rows of one kind and tensor, in model order (one small query)."""
    kind = check_kind(kind)
    tensor = DEFAULT_TENSOR[kind] if tensor is None else tensor
    frame = run.sql(
        "select distinct module from stats where kind = $kind and tensor = $tensor"
        " and phase = $phase and not coalesce(sentinel, false)",
        {"kind": kind, "tensor": tensor, "phase": check_phase(phase)},
    )
    present = set(frame["module"])
    return [info.name for info in run.modules if info.name in present]


def layer_matrix(
    frame: pandas.DataFrame, layers: Sequence[str], column: str
) -> tuple[np.ndarray, np.ndarray]:
    """The recorded steps and a float64 (layers, steps) matrix of ``column``.

    NaN where a layer has no row at a step.
    """
    steps = np.unique(frame["step"].to_numpy(dtype=np.int64))
    values = np.full((len(layers), len(steps)), np.nan)
    row_of = {name: index for index, name in enumerate(layers)}
    rows = frame["module"].map(row_of).to_numpy(dtype=np.int64)
    columns = np.searchsorted(steps, frame["step"].to_numpy(dtype=np.int64))
    values[rows, columns] = frame[column].to_numpy(dtype=np.float64, na_value=np.nan)
    return steps, values


def figure(
    rows: int, *, width: float = 8.0, height: float = 3.0, sharex: bool = True
) -> tuple[Figure, Any]:
    """A pyplot-free ``Figure`` with ``rows`` stacked axes (an array of them)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, max(height, height * rows * 0.8)), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False, sharex=sharex)[:, 0]
    return fig, axes
