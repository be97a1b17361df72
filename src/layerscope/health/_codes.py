"""What the rules need of each identity code, as columns indexed by the code.

A row carries its identity as a code; the rules ask of it its phase, kind, call, module and
tensor. Each code is decoded once, the first flush that brings it, into a row of small
integers; a flush's rows then take their fields with one indexing. Modules, (module, tensor)
pairs and (module, kind, tensor) triples get dense ids that the rules key their state by.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from layerscope.health._order import ModuleOrder
from layerscope.model import Identities

# The kinds the rules tell apart; any other is OTHER.
KINDS = ("activation", "grad", "weight", "weight_grad", "update", "input", "buffer")
ACTIVATION, GRAD, WEIGHT, WEIGHT_GRAD, UPDATE, INPUT, BUFFER = range(len(KINDS))
OTHER = len(KINDS)
# The fields of a code, columns of ``Codes.of``'s table.
PHASE, KIND, FIRST_CALL, MODULE, PAIR, SLOT, IS_WEIGHT = range(7)
FIELDS = 7
# Modules that only reshape or pass on their input: zeros there are the layer before's.
PASS_THROUGH = frozenset(
    ("Flatten", "Unflatten", "Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
     "AlphaDropout", "FeatureAlphaDropout")
)  # fmt: skip


class _Ids:
    """Dense ids of hashable values, in the order first seen."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.values: list[Any] = []

    def __call__(self, value: Any) -> int:
        given = self.ids.get(value)
        if given is None:
            given = self.ids[value] = len(self.values)
            self.values.append(value)
        return given


class Codes:
    """The decoded fields of each identity code, and the ids the rules key their state by.

    Phase 0 is ``"train"``; other phases follow in the order seen.
    """

    def __init__(self, order: ModuleOrder) -> None:
        self.order = order
        self.phases = _Ids()
        self.phases("train")
        self.modules = _Ids()  # module names
        self.pairs = _Ids()  # (module, tensor)
        self.slots = _Ids()  # (module, kind, tensor)
        self._tables: dict[int, tuple[Identities, list[Tensor]]] = {}
        self._ranks: tuple[int, int, Tensor] = (-1, 0, torch.empty(0, dtype=torch.int64))
        self._passing: Tensor = torch.empty(0, dtype=torch.bool)

    def of(self, identities: Identities) -> list[Tensor]:
        """Each field (``PHASE``, ``KIND``, ...) of every code, int64 by code.

        A field a tensor: indexing one stays below the size where torch splits an operation
        across threads, which would contend with the training thread's.
        """
        held = self._tables.get(id(identities))
        table = held[1] if held is not None else [torch.empty(0, dtype=torch.int64)] * FIELDS
        rows = identities.identities
        if len(table[0]) < len(rows):
            new = torch.tensor(
                [self._decode(identity) for identity in rows[len(table[0]) :]], dtype=torch.int64
            ).reshape(-1, FIELDS)
            table = [torch.cat([old, new[:, f]]) for f, old in enumerate(table)]
            # The identities are held too: their id is not reused while they are.
            self._tables[id(identities)] = (identities, table)
        return table

    def _decode(self, identity: Any) -> list[int]:
        kind = identity.kind.value
        return [
            self.phases(identity.phase),
            KINDS.index(kind) if kind in KINDS else OTHER,
            int(identity.call == 0),
            self.modules(identity.module),
            self.pairs((identity.module, identity.tensor)),
            self.slots((identity.module, kind, identity.tensor)),
            int(identity.tensor == "weight"),
        ]

    def forward_ranks(self) -> Tensor:
        """Each module id's place in the forward pass (equal places for equal sort keys)."""
        version, count, ranks = self._ranks
        names = self.modules.values
        if version != self.order.version or count != len(names):
            keys = [self.order.forward(name) for name in names]
            place = {key: rank for rank, key in enumerate(sorted(set(keys)))}
            ranks = torch.tensor([place[key] for key in keys], dtype=torch.int64)
            self._ranks = (self.order.version, len(names), ranks)
        return ranks

    def passing(self) -> Tensor:
        """Which module ids only pass their input on (Flatten, Dropout, ...)."""
        names = self.modules.values
        if len(self._passing) != len(names):
            self._passing = torch.tensor(
                [self.order.type_of(name) in PASS_THROUGH for name in names], dtype=torch.bool
            )
        return self._passing
