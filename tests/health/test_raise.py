"""``alerts="raise"`` stops training at the step of the first non-finite value."""

from __future__ import annotations

import pytest
import torch
from pathologies import BlowUp, NaNInBackward, train
from torch import nn

import layerscope


def test_it_raises_at_the_step_naming_the_module_on_an_unrecorded_step():
    torch.manual_seed(0)
    blow_up = BlowUp(at=13)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), blow_up, nn.Linear(16, 1))
    with pytest.raises(layerscope.NonFiniteError) as raised:
        train(model, 20, every=layerscope.Schedule(every=10), alerts="raise")
    message = str(raised.value)
    assert "at step 13 in the forward pass" in message
    assert "activation out of 2 (BlowUp)" in message
    assert blow_up.calls == 14  # stopped in step 13: no forward of step 14 ran


def test_a_backward_nan_is_named_as_the_backward_pass():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), NaNInBackward(at=3), nn.Tanh(), nn.Linear(16, 1))
    with pytest.raises(layerscope.NonFiniteError, match=r"at step 3 in the backward pass"):
        train(model, 8, alerts="raise")


def test_the_scope_is_closed_as_failed_and_keeps_its_rows(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), BlowUp(at=2), nn.Linear(16, 1))
    with pytest.raises(layerscope.NonFiniteError):
        train(model, 5, run=tmp_path / "run", alerts="raise")
    run = layerscope.load(tmp_path / "run")
    assert run.meta["status"] == "failed"
    assert sorted(set(run.stats.step)) == [0, 1, 2]
    assert run.alerts.rule.tolist() == ["nonfinite"]
    assert not model[0]._forward_hooks  # the with block's exit removed the hooks


def test_a_finite_run_is_not_stopped_and_trains_as_unwatched():
    def run(watched: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        if watched:
            train(model, 12, every=layerscope.Schedule(every=5), alerts="raise")
        else:
            generator = torch.Generator().manual_seed(0)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(12):
                x = torch.randn(32, 8, generator=generator)
                (model(x) - x[:, :1]).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    for watched, plain in zip(run(True), run(False), strict=True):
        assert torch.equal(watched, plain)
