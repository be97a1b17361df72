"""An optimizer layerscope cannot hook is refused at ``watch()``, by the argument's name.

Step hooks live in dictionaries that ``torch.optim.Optimizer.__init__`` makes. A subclass that
never calls it (as wrappers do) has none; unless it wraps a torch optimizer that can be hooked
instead (accelerate's ``.optimizer``), watching it cannot follow its steps.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope
from tests.integration._util import has_no_hooks


class Unhookable(torch.optim.Optimizer):
    """Looks like an optimizer, but its __init__ skips Optimizer.__init__."""

    def __init__(self, params) -> None:
        self.param_groups = [{"params": list(params), "lr": 0.1}]
        self.state = {}
        self.defaults = {"lr": 0.1}

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.sub_(group["lr"] * param.grad)


class WrapsNothingHookable(Unhookable):
    """A wrapper whose ``.optimizer`` is not a torch optimizer either."""

    def __init__(self, params) -> None:
        super().__init__(params)
        self.optimizer = object()


@pytest.mark.parametrize("kind", [Unhookable, WrapsNothingHookable])
def test_an_optimizer_that_cannot_be_hooked_is_refused(tmp_path, kind):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    optimizer = kind(model.parameters())
    run = tmp_path / "r"
    with pytest.raises(TypeError, match="optimizer"):
        layerscope.watch(model, optimizer=optimizer, every=1, run=run)
    assert not run.exists()
    assert has_no_hooks(model)
    # The model and optimizer still train as before.
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


def test_a_plain_torch_optimizer_is_still_accepted():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert scope.current_step == 1
