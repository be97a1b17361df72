"""Which of the watched parameters the optimizer leaves out, and which are weight matrices."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn


def left_out_of(
    targets: Iterable[tuple[str, nn.Module]], optimizers: Sequence[torch.optim.Optimizer]
) -> frozenset[tuple[str, str]] | None:
    """The watched modules' own parameters that need a gradient and no optimizer steps.

    None where no optimizer is known.
    """
    if not optimizers:
        return None
    stepped = {
        id(p) for optimizer in optimizers for g in optimizer.param_groups for p in g["params"]
    }
    return frozenset(
        (name, tensor)
        for name, module in targets
        for tensor, parameter in module.named_parameters(recurse=False)
        if parameter.requires_grad and id(parameter) not in stepped
    )


def matrices_of(targets: Iterable[tuple[str, nn.Module]]) -> frozenset[tuple[str, str]]:
    """The watched modules' own parameters of two dimensions or more: weight matrices."""
    return frozenset(
        (name, tensor)
        for name, module in targets
        for tensor, parameter in module.named_parameters(recurse=False)
        if parameter.dim() >= 2
    )
