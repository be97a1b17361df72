"""``constant_input``: a batch whose samples are all one, seen in the first layer's output."""

from __future__ import annotations

import torch
from torch import Tensor, nn

import layerscope


class Conditioned(nn.Module):
    """fc1 on the input, plus ``cond``: a layer whose input is one learned vector, repeated."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.start = nn.Parameter(torch.randn(1, 8))
        self.cond = nn.Linear(8, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.fc1(x)
        cond = self.cond(self.start.expand(len(x), -1))  # equal rows, as designed
        out: Tensor = self.head(torch.relu(hidden + cond))
        return out


def _alerts(batch: int, repeated_from: int, steps: int = 5) -> list[tuple[str, str, int]]:
    """Train with every sample of the batch the first one from step ``repeated_from``."""
    torch.manual_seed(0)
    model = Conditioned()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, run=None, every=1) as scope:
        for step in range(steps):
            x = torch.randn(batch, 16)
            if step >= repeated_from:
                x = x[:1].expand_as(x)  # a collate step that repeats one sample
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    alerts = scope.frame("alerts")
    said = zip(alerts.rule, alerts.module, alerts.step, strict=True)
    return [alert for alert in said if alert[0] == "constant_input"]


def test_a_batch_of_one_repeated_sample_is_named_at_the_first_layer_alone():
    # cond's output has equal rows at every step: it is not the first layer, and not named.
    assert _alerts(batch=16, repeated_from=2) == [("constant_input", "fc1", 2)]
    assert _alerts(batch=16, repeated_from=99) == []  # a varying batch
    assert _alerts(batch=4, repeated_from=0) == []  # too small a batch to tell
