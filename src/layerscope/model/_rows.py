"""``StatsRows``: finalised rows of statistics, as sinks receive them.

A sink's ``write(records)`` gets ``records.stats``, a ``StatsRows``: one flush's rows with
integer keys and statistics as arrays. ``columns()`` gives every column by name (key columns
decoded to Python values, statistics as float64 or int64 tensors), ``hist`` the histograms,
and where the log2 histogram was counted split by sign, ``negative`` its negative half.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from layerscope.model._identities import FORM_COLUMNS, IDENTITY_COLUMNS, Identities


@dataclass(slots=True)
class StatsRows:
    """Finalised rows of one flush: integer keys, statistics and histograms as arrays.

    ``len(rows)`` rows; ``columns()`` by name; ``hist`` a ``(rows, slots)`` float64 tensor of
    counts (None without histograms) and ``hist_valid()`` which rows have one. A log2
    ``hist`` counts magnitudes; where a sink asked for signed histograms, ``negative`` holds
    each slot's count among the values whose sign bit is set (``-0.0`` in slot 0, -inf and
    such NaN in slot 255), and ``hist - negative`` is the positive half. ``step``,
    ``identity`` and ``form`` are int64 tensors; the last two are codes into
    ``identities.identities`` and ``identities.forms``, for writers that build columns without
    a Python loop.
    """

    step: Tensor  # (rows,) int64
    identity: Tensor  # (rows,) int64 codes of ``identities.identities``
    form: Tensor  # (rows,) int64 codes of ``identities.forms``
    identities: Identities
    rank: int
    stats: dict[str, Tensor]  # numel and the built-in statistics kept, each (rows,)
    custom: dict[str, list[Any]] = field(default_factory=dict)
    hist: Tensor | None = None  # (rows, slots) float64 counts (exact below 2**53), if kept
    sentinel: bool = False  # rows of the sentinel: only SENTINEL_STATS are there
    negative: Tensor | None = None  # (rows, 256) float64: a log2 hist's negative half, if split

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


def join_columns(chunks: Sequence[StatsRows]) -> dict[str, list[Any]]:
    """All rows' columns joined as Python lists; ``hist`` holds int64 tensors or None."""
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
