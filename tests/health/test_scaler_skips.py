"""``scaler_skips``: GradScaler's skipped steps counted, the layer that overflowed named."""

from __future__ import annotations

import torch
from torch import Tensor, nn

import layerscope
from layerscope.health import HealthMonitor, parse_alerts


def _skips(skipped: set[int], steps: int = 60, **options: object) -> list[tuple[int, str]]:
    monitor = HealthMonitor(parse_alerts({"scaler_skips": options}), [])
    scalars = []
    for step in range(steps):
        scalars.append((step, "loss", 1.0))
        if step in skipped:
            scalars.append((step, "skipped", 1.0))
    alerts = monitor.observe([], scalars)
    return [(alert.step, alert.message) for alert in alerts if alert.rule == "scaler_skips"]


def test_skips_in_a_row_after_the_scale_is_found_are_caught_at_the_third():
    # Six skips from the first step find the scale; one later skip probes it; then every
    # step overflows from step 30: one alert, at its third skip.
    [(step, message)] = _skips({0, 1, 2, 3, 4, 5, 20, *range(30, 60)})
    assert step == 32
    assert "3 optimizer steps skipped in a row by step 32" in message


def test_a_scale_that_keeps_falling_is_caught_and_the_first_search_only_when_endless():
    [(step, _)] = _skips({21, 23, 25, 27, 29, 31})  # every other step: the fifth in 20 steps
    assert step == 29
    assert _skips(set(range(15))) == []
    [(step, message)] = _skips(set(range(40)))
    assert step == 15
    assert "16 optimizer steps skipped in a row from the first step" in message


class _UnitRows(nn.Module):
    """Rows scaled to unit length with eps outside the root: a zero row's backward is NaN."""

    def forward(self, x: Tensor) -> Tensor:
        return x / (x.pow(2).sum(-1, keepdim=True).sqrt() + 1e-6)


def test_the_layer_whose_gradient_overflowed_first_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, bias=False), _UnitRows(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with layerscope.watch(model, optimizer=optimizer, run=None, every=1) as scope:
        for step in range(8):
            x = torch.randn(6, 4)
            if step >= 3:
                x[-1] = 0.0  # a padding row
            loss = nn.functional.cross_entropy(model(x), torch.zeros(6, dtype=torch.long))
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]  # untyped in torch
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scope.step(loss=loss.detach())
    alerts = scope.frame("alerts")
    [skips] = alerts[alerts.rule == "scaler_skips"].itertuples()
    assert skips.step == 5
    # The unit rows' backward makes the NaN: the first gradient it reaches is layer 0's output's.
    assert skips.module == "0"
    assert "on recorded step 3 the gradient of 0 overflowed first" in skips.message
