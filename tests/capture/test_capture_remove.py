"""``Capture.remove``: one module stops being captured, the others go on (torchfunc's remove(i))."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _train_step(
    net: nn.Sequential, sgd: torch.optim.Optimizer, cap: layerscope.tensors.Capture
) -> None:
    net(torch.randn(5, 3)).sum().backward()
    sgd.step()
    sgd.zero_grad()
    cap.step()


def _kept(cap: layerscope.tensors.Capture, step: int) -> set[tuple[str, str]]:
    return {(record.module, record.kind) for record in cap.records if record.step == step}


@pytest.mark.parametrize("how", ["module", "name", "position"])
def test_a_removed_module_keeps_its_records_and_gets_no_more(how: str) -> None:
    net = _net()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    kinds = ["activation", "grad", "weight_grad"]
    with layerscope.capture(net, optimizer=sgd, kinds=kinds) as cap:
        _train_step(net, sgd, cap)
        before = cap.hooks
        chosen = {"module": net[0], "name": "0", "position": 0}[how]
        cap.remove(chosen)
        assert cap.modules == ["1", "2"]
        # Its forward hook and its two parameters' gradient hooks are gone.
        assert cap.hooks == before - 3
        _train_step(net, sgd, cap)
    first = {(module, kind) for module in ("0", "1", "2") for kind in kinds}
    first -= {("1", "weight_grad")}  # Tanh has no parameter
    assert _kept(cap, 0) == first
    assert _kept(cap, 1) == {item for item in first if item[0] != "0"}
    # What it kept still holds the first step's values.
    weight = next(r for r in cap.records if r.module == "0" and r.kind == "weight_grad")
    assert weight.step == 0
    assert weight.tensor == "weight"


def test_a_removal_mid_step_keeps_no_later_value_of_that_step() -> None:
    net = _net()
    with layerscope.capture(net, kinds=["activation", "grad"]) as cap:
        loss = net(torch.randn(5, 3)).sum()
        cap.remove("2")  # its output's gradient hook was registered in the forward
        loss.backward()
    assert ("2", "grad") not in _kept(cap, 0)
    assert ("0", "grad") in _kept(cap, 0)
    assert ("2", "activation") in _kept(cap, 0)


def test_a_removal_names_what_it_expected() -> None:
    net = _net()
    with layerscope.capture(net) as cap:
        with pytest.raises(ValueError, match=r"module: 'head' is not among the modules captured"):
            cap.remove("head")
        with pytest.raises(ValueError, match="'Linear' is not among"):
            cap.remove(nn.Linear(1, 1))
        with pytest.raises(IndexError, match=r"position 3 is outside capture\.modules"):
            cap.remove(3)
        with pytest.raises(TypeError, match="module: expected a module"):
            cap.remove(1.5)  # type: ignore[arg-type]
        cap.remove(-1)
        assert cap.modules == ["0", "1"]
    with pytest.raises(RuntimeError, match="remove\\(\\) after close"):
        cap.remove("0")
