"""Small models with a planted pathology each, trained a few steps while watched."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

import layerscope


class BlowUp(nn.Module):
    """Divides by zero at forward call ``at``: non-finite from there."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x / 0.0 if self.calls - 1 == self.at else x


class _NaNBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * float("nan")


class NaNInBackward(nn.Module):
    """Finite forward; its backward returns NaN from call ``at`` on."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return _NaNBackward.apply(x) if self.calls - 1 >= self.at else x


def train(
    model: nn.Module,
    steps: int,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    inputs: int = 8,
    batch: int = 32,
    seed: int = 0,
    same_batch: bool = False,
    before: Callable[[int], None] | None = None,
    **watch: object,
) -> layerscope.Scope:
    """Train ``model`` on a fixed regression task for ``steps`` steps, watched; the scope.

    ``same_batch``: the first batch every step; ``before``: called with each step first.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
    watch.setdefault("every", 1)
    first = torch.randn(batch, inputs, generator=generator)
    with layerscope.watch(model, optimizer=optimizer, **watch) as scope:  # type: ignore[arg-type]
        for step in range(steps):
            if before is not None:
                before(step)
            x = first if same_batch or not step else torch.randn(batch, inputs, generator=generator)
            loss = (model(x) - x[:, :1]).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return scope


def mlp(widths: list[int], activation: type[nn.Module] = nn.ReLU, seed: int = 0) -> nn.Sequential:
    """Linear layers of ``widths`` with ``activation`` between them."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)
