"""Hooks come off, nothing is kept alive, training is untouched, bad arguments are named."""

from __future__ import annotations

import copy
import gc
import re
import sys
import weakref

import pytest
import torch
from torch import nn

import layerscope


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Dropout(0.2), nn.Linear(8, 2)
    )


def _hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    ) + sum(len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def test_hooks_are_gone_after_close_and_after_an_exception():
    model = _net()
    cap = layerscope.capture(model, kinds=("activation", "grad", "input"))
    assert _hook_count(model) == cap.hooks > 0
    cap.close()
    assert _hook_count(model) == cap.hooks == 0
    assert "closed" in repr(cap)

    failing = layerscope.capture(model)
    hooked = []

    def body():
        with failing:
            model(torch.randn(3, 4)).sum().backward()
            hooked.append(_hook_count(model))
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        body()
    assert hooked[0] > 0
    assert _hook_count(model) == failing.hooks == 0
    assert len(failing.records) > 0  # what was kept stays


def test_gradients_of_a_graph_built_before_close_are_not_kept_after_it():
    model = _net()
    with layerscope.capture(model) as cap:
        out = model(torch.randn(3, 4))
    kept = len(cap.records)
    out.sum().backward()
    assert len(cap.records) == kept
    assert {r.kind for r in cap.records} == {"activation"}


def test_nothing_keeps_the_model_or_the_graph_alive_after_close():
    model = _net()
    x = torch.randn(3, 4)
    with layerscope.capture(model) as cap:
        out = model(x)  # no backward: the graph holds x (saved for the weight's gradient)
    inputs = weakref.ref(x)
    model_ref = weakref.ref(model)
    assert out.grad_fn is not None
    del model, out, x
    gc.collect()
    assert model_ref() is None
    assert inputs() is None
    assert len(cap.records) > 0
    assert all(r.value.grad_fn is None for r in cap.records)


def test_an_open_capture_does_not_keep_its_model_alive():
    model = _net()
    cap = layerscope.capture(model)
    model_ref = weakref.ref(model)
    del model
    gc.collect()
    assert model_ref() is None
    cap.close()


def _train(model: nn.Module, cap=None, steps: int = 5) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(3)
    for _ in range(steps):
        torch.manual_seed(7)  # dropout's mask
        loss = model(torch.randn(16, 4, generator=generator)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if cap is not None:
            cap.step()


def test_training_is_bit_identical_with_and_without_capture():
    plain = _net()
    captured = copy.deepcopy(plain)
    _train(plain)
    with layerscope.capture(
        captured, kinds=("activation", "grad", "input"), stash_value=lambda t: t * 2
    ) as cap:
        _train(captured, cap)
    assert len(cap.records) > 0
    for (name, a), b in zip(
        plain.state_dict().items(), captured.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_failing_stash_value_warns_once_and_training_goes_on():
    model = _net()

    def broken(tensor):
        raise RuntimeError("no")

    with layerscope.capture(model, stash_value=broken) as cap:
        with pytest.warns(layerscope.LayerscopeWarning, match="no"):
            model(torch.randn(3, 4)).sum().backward()
        model(torch.randn(3, 4)).sum().backward()
    assert cap.failures == 2 * 2 * 5
    assert cap.records == []


def test_step_after_close_and_reentering_are_refused():
    cap = layerscope.capture(nn.Linear(2, 2))
    cap.close()
    cap.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        cap.step()
    with pytest.raises(RuntimeError, match="closed"), cap:
        pass


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"model": "not a module"}, TypeError, "model"),
        ({"include": "("}, ValueError, "include"),
        ({"exclude": 3}, TypeError, "exclude"),
        ({"types": int}, TypeError, "types"),
        ({"include": "nothing-matches"}, ValueError, "include"),
        ({"kinds": ("weight",)}, ValueError, "kinds"),
        ({"kinds": ()}, ValueError, "kinds"),
        ({"condition": 1}, TypeError, "condition"),
        ({"condition": lambda a, b: True}, TypeError, "condition"),
        ({"reduction": "median"}, ValueError, "reduction"),
        ({"reduction": 2}, TypeError, "reduction"),
        ({"stash_value": "std"}, TypeError, "stash_value"),
        ({"every": 0}, ValueError, "every"),
        ({"every": 1.5}, TypeError, "every"),
        ({"device": "nowhere"}, ValueError, "device"),
        ({"device": 3}, TypeError, "device"),
        ({"max_bytes": -1}, ValueError, "max_bytes"),
        ({"max_bytes": True}, TypeError, "max_bytes"),
    ],
)
def test_bad_arguments_get_errors_that_name_them(kwargs, error, argument):
    arguments = {"model": nn.Sequential(nn.Linear(2, 2)), **kwargs}
    with pytest.raises(error, match=rf"^{re.escape(argument)}"):
        layerscope.capture(**arguments)


def test_to_frame_has_the_metadata_and_the_statistic():
    pd = pytest.importorskip("pandas")
    model = _net()
    with layerscope.capture(model, include="^0$") as cap:
        out = model[0](torch.randn(6, 4))
        out.sum().backward()
    frame = cap.to_frame()
    assert list(frame.columns) == [
        "module",
        "type",
        "kind",
        "tensor",
        "step",
        "phase",
        "call",
        "count",
        "dtype",
        "shape",
        "std",
    ]
    assert frame["std"].tolist() == pytest.approx([out.detach().std().item(), 0.0])
    means = cap.to_frame(torch.mean, stat_name="mean_value")
    assert isinstance(means, pd.DataFrame)
    assert means["mean_value"].iloc[1] == 1.0


def test_importing_layerscope_imports_neither_safetensors_nor_pandas():
    import subprocess

    code = "import sys, layerscope; print(sorted({'safetensors', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
