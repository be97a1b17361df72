"""What a figure reads a run through: a stored ``Run`` and a scope's in-memory run alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas

    from layerscope.model import ModuleInfo

#: Values bound to a query's placeholders: a list for ``?``, a dict for ``$name`` (as
#: ``Run.sql`` takes them; the plots do not import the store).
Parameters = Sequence[Any] | Mapping[str, Any] | None


class RunTables(Protocol):
    """A run's ``meta`` (its ``run.json``), its module tree and SQL over its tables."""

    meta: dict[str, Any]

    @property
    def modules(self) -> list[ModuleInfo]:
        """The module tree, in model order."""

    def sql(self, query: str, params: Parameters = None) -> pandas.DataFrame:
        """A DuckDB query over the tables ``stats``, ``scalars``, ``alerts`` and ``calls``.

        ``params`` binds its ``?`` or ``$name`` placeholders.
        """
