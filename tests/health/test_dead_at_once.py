"""``dead``: a rectifier whose whole output is zero is named at its second recorded step;
anything less certain still waits ``steps`` recorded steps."""

from __future__ import annotations

import torch
from pathologies import mlp, train
from torch import nn

import layerscope


def _dead(scope: layerscope.Scope) -> list[tuple[str, int]]:
    alerts = scope.frame("alerts")
    alerts = alerts[alerts.rule == "dead"]
    return list(zip(alerts.module, alerts.step, strict=True))


def _killed(widths: list[int]) -> nn.Sequential:
    """An MLP whose second ReLU ("3") gets only negative inputs: all its outputs are zero."""
    model = mlp(widths)
    with torch.no_grad():
        model[2].bias.fill_(-100.0)
    return model


def test_a_rectifier_output_wholly_zero_is_named_at_the_second_recorded_step():
    # 32 samples of 32 units, every one zero: no gradient passes to revive fc "2".
    assert _dead(train(_killed([8, 32, 32, 1]), 4, run=None)) == [("3", 1)]
    # Recorded steps 0 and 2: the second of them.
    assert _dead(train(_killed([8, 32, 32, 1]), 5, every=2, run=None)) == [("3", 2)]
    # 4 samples of 8 units: 32 zeros may be one batch's chance; three recorded steps.
    assert _dead(train(_killed([8, 8, 8, 1]), 4, batch=4, run=None)) == [("3", 2)]


class _Branches(nn.Module):
    """Two branches read by one head: ``zeroed`` (Linear initialised to zero, Tanh) and
    ``killed`` (Linear whose bias makes every input of its ReLU negative)."""

    def __init__(self) -> None:
        super().__init__()
        self.zeroed = nn.Sequential(nn.Linear(8, 64), nn.Tanh())
        self.killed = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(96, 1)
        with torch.no_grad():
            self.zeroed[0].weight.zero_()
            self.zeroed[0].bias.zero_()
            self.killed[0].bias.fill_(-100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.cat([self.zeroed(x), self.killed(x)], dim=1))
        return out


def test_a_zero_initialised_layer_under_a_warm_up_from_zero_is_not_dead():
    # The zeroed branch outputs zeros until the rate, 0 at the first step of a warm-up, moves
    # it: two recorded steps of zeros, then none. The ReLU beside it stays dead.
    torch.manual_seed(0)
    model = _Branches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warm_up = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(step / 5, 1.0))
    with layerscope.watch(model, optimizer=optimizer, every=1, run=None) as scope:
        for _ in range(5):
            x = torch.randn(32, 8)
            (model(x) - x[:, :1]).pow(2).mean().backward()
            optimizer.step()
            warm_up.step()
            optimizer.zero_grad()
            scope.step()
    frame = scope.frame()
    for module in ("zeroed.0", "zeroed.1"):
        zeros = frame[(frame.module == module) & (frame.kind == "activation")].zero_frac
        assert zeros.tolist()[:2] == [1.0, 1.0]  # as planted
        assert zeros.tolist()[2] < 1.0
    assert _dead(scope) == [("killed.1", 1)]
