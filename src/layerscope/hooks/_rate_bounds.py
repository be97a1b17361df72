"""How far an adaptive optimizer's step may move each watched weight, against its size.

Adam and its kin scale each element's step to about the learning rate whatever the gradient's
size (exactly the rate at their first step), so ``lr / rms(weight)`` bounds the ratio of the
step to the weight it moves, before a single update has grown the weight. Read on recorded
steps just before the optimizer's step: the groups' rates as Python numbers, and the
parameters' norms in one multi-tensor op, left on their device for the health rules to read
on the writer thread: no host sync. A rate held in a tensor is not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from layerscope.distributed import local_tensor
from layerscope.recording import Owner

# Optimizers whose per-element step is about the learning rate, whatever the gradient's size.
ADAPTIVE: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
)


class RateBounds(NamedTuple):
    """The watched parameters an adaptive optimizer steps, with its rate and their RMS."""

    pairs: tuple[tuple[str, str], ...]  # (module, tensor) of each, as its first owner names it
    optimizer: tuple[str, ...]  # the optimizer's class name, of each
    rates: tuple[float, ...]  # the learning rate of its group, of each
    norms: tuple[Tensor, ...]  # its L2 norm before the step, a 0-d float32 tensor, of each
    sizes: tuple[int, ...]  # how many elements the norm is of, of each


def rate_bounds(
    optimizer: torch.optim.Optimizer, params: Sequence[tuple[Tensor, Sequence[Owner]]]
) -> RateBounds | None:
    """The bounds of the ``params`` that ``optimizer`` steps; None if it is not adaptive.

    Examples:
        >>> import torch
        >>> layer = torch.nn.Linear(4, 2, bias=False)
        >>> from layerscope.recording import Owner
        >>> owned = [(layer.weight, [Owner("fc", "Linear", "weight")])]
        >>> bounds = rate_bounds(torch.optim.Adam(layer.parameters(), lr=0.1), owned)
        >>> bounds.pairs, bounds.optimizer, bounds.rates
        ((('fc', 'weight'),), ('Adam',), (0.1,))
        >>> rate_bounds(torch.optim.SGD(layer.parameters(), lr=0.1), owned) is None
        True
    """
    if not isinstance(optimizer, ADAPTIVE):
        return None
    rates: dict[int, float] = {}
    for group in optimizer.param_groups:
        lr = group.get("lr")
        if isinstance(lr, int | float) and not isinstance(lr, bool) and lr > 0:
            for param in group["params"]:
                rates[id(param)] = float(lr)
    chosen = [
        (param, owners[0])
        for param, owners in params
        if id(param) in rates and param.is_floating_point()
    ]
    if not chosen:
        return None
    # Float64 keeps its own; narrower floats sum their squares in float32, where they fit.
    chosen.sort(key=lambda entry: entry[0].dtype == torch.float64)
    with torch.no_grad():  # one launch per list on a GPU; a shard's RMS is the whole's
        local = [local_tensor(param).detach() for param, _ in chosen]
        wide = sum(tensor.dtype == torch.float64 for tensor in local)
        narrow = len(local) - wide
        norms = [
            *(torch._foreach_norm(local[:narrow], 2, dtype=torch.float32) if narrow else ()),
            *(torch._foreach_norm(local[narrow:], 2) if wide else ()),
        ]
    return RateBounds(
        pairs=tuple((owner.module, owner.tensor) for _, owner in chosen),
        optimizer=(type(optimizer).__name__,) * len(chosen),
        rates=tuple(rates[id(param)] for param, _ in chosen),
        norms=tuple(norms),
        sizes=tuple(tensor.numel() for tensor in local),
    )


def joined(bounds: Sequence[RateBounds]) -> RateBounds | None:
    """The bounds of several optimizers as one; None where there are none."""
    if not bounds:
        return None
    return RateBounds(
        pairs=tuple(pair for b in bounds for pair in b.pairs),
        optimizer=tuple(name for b in bounds for name in b.optimizer),
        rates=tuple(rate for b in bounds for rate in b.rates),
        norms=tuple(norm for b in bounds for norm in b.norms),
        sizes=tuple(size for b in bounds for size in b.sizes),
    )
