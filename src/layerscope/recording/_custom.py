"""Custom statistics (``stats={name: fn}``, also per kind): computed on the device, kept as values.

Each function gets the detached tensor as recorded and returns a scalar or a 1-D tensor; its
values go into the device buffer's value area, and the reading keeps where (``CustomRef``).
Which functions a reading gets depends on its kind (``KindStats``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from layerscope.model import Kind
from layerscope.recording._buffer import DeviceRows
from layerscope.recording._readings import CustomRef
from layerscope.stats import CustomStat


class KindStats:
    """The custom statistics of each kind, resolved once.

    Kinds without statistics of their own share the one mapping of every kind's, so that a
    tensor recorded as one kind and then as another (an output that is the next module's
    input) shares its values as it shares its partials.

    Args:
        every: the custom statistics of every kind.
        by_kind: each kind's own (a name in both: the kind's function).
    """

    __slots__ = ("_of",)

    def __init__(
        self,
        every: Mapping[str, CustomStat],
        by_kind: Mapping[str, Mapping[str, CustomStat]] | None = None,
    ) -> None:
        own = by_kind or {}
        self._of = {
            kind: {**every, **own[kind.value]} if own.get(kind.value) else every for kind in Kind
        }

    def of(self, kind: Kind) -> Mapping[str, CustomStat]:
        """The custom statistics of ``kind``'s readings (empty if none)."""
        return self._of[kind]


def compute_custom(
    rows: DeviceRows,
    tensor: Tensor,
    stats: Mapping[str, CustomStat],
    fail: Callable[[str, BaseException], None],
) -> tuple[CustomRef, ...]:
    """Each of ``stats`` of ``tensor`` into ``rows``' values; where each went.

    Integer and boolean tensors get none. A function that raises or returns more than 1-D
    costs only its own value (``fail`` names it).
    """
    if not tensor.is_floating_point():
        return ()
    out = []
    with torch.no_grad():
        for name, fn in stats.items():
            try:
                value = fn(tensor.detach())
                if not isinstance(value, Tensor):
                    value = torch.tensor(float(value), dtype=torch.float64)
                if value.dim() > 1:
                    raise ValueError(f"returned shape {tuple(value.shape)}, expected 0-d or 1-D")
                offset, length = rows.add_values(value)
                out.append((name, offset, length, value.dim() == 0, tensor.numel()))
            except Exception as error:
                fail(f"custom statistic {name!r}", error)
    return tuple(out)
