"""stash and stash_value as tensor_tracker's users write them: any value kept, saved, framed."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import Tensor, nn

import layerscope
from layerscope.tensors import Event
from layerscope.tensors._records import is_compact


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 2))


def _seen(model: nn.Module, x: Tensor) -> dict[tuple[str, str], Tensor]:
    """Outputs and output gradients of every layer, by plain hooks written here."""
    seen = {}
    handles = []
    for name, module in model.named_children():

        def hook(module, args, out, name=name):
            seen[(name, "activation")] = out.detach().clone()
            out.register_hook(lambda grad: seen.__setitem__((name, "grad"), grad.clone()))

        handles.append(module.register_forward_hook(hook))
    model(x).pow(2).sum().backward()
    for handle in handles:
        handle.remove()
    return seen


def test_a_stash_value_returning_a_float_keeps_one_float_per_tensor():
    x = torch.randn(5, 4)
    expected = _seen(_model(), x)
    model = _model()
    with layerscope.capture(model, stash_value=lambda t: t.std().item()) as cap:
        model(x).pow(2).sum().backward()
    assert cap.failures == 0
    assert len(cap.records) == 6
    for record in cap.records:
        assert type(record.value) is float
        assert record.value == expected[(record.module, record.kind)].std().item()
    frame = cap.to_frame()
    assert list(frame["dtype"].unique()) == ["float"]
    assert frame["shape"].isna().all()
    assert frame["std"].tolist() == [record.value for record in cap.records]


def test_a_tuple_keeps_compact_copies_of_its_tensors_and_its_numbers():
    x = torch.randn(5, 4)
    expected = _seen(_model(), x)
    model = _model()
    with layerscope.capture(
        model, include="^0$", stash_value=lambda t: (t[:2], t.abs().max().item(), "tag")
    ) as cap:
        model(x).pow(2).sum().backward()
    for record in cap.records:
        head, top, tag = record.value
        whole = expected[(record.module, record.kind)]
        assert torch.equal(head, whole[:2])
        assert is_compact(head)
        assert not head.requires_grad
        assert top == whole.abs().max().item()
        assert tag == "tag"
    assert cap.bytes == 2 * (2 * 6 * 4)  # the tensors' bytes; numbers and strings count none
    frame = cap.to_frame(torch.mean)  # the first value's statistic, as tensor_tracker's
    assert frame["dtype"].tolist() == ["tuple", "tuple"]
    assert frame["mean"].tolist() == [r.value[0].mean().item() for r in cap.records]


def test_stash_gets_the_module_its_call_and_the_tensor_and_keeps_what_it_returns():
    events: list[Event] = []
    x = torch.randn(5, 4)
    expected = _seen(_model(), x)
    model = _model()

    def stash(event: Event) -> dict:
        events.append(event)
        return {"norm": event.value.norm(), "step": event.step}

    with layerscope.capture(model, kinds=("activation", "grad", "input"), stash=stash) as cap:
        model(x).pow(2).sum().backward()
    by_key = {(e.name, e.kind, e.tensor): e for e in events}
    forward = by_key[("0", "activation", "out")]
    assert forward.module is model[0]
    assert forward.args[0] is x
    assert forward.kwargs == {}
    assert by_key[("0", "input", "in.input")].value.equal(x)  # Linear.forward(self, input)
    grad = by_key[("2", "grad", "out")]
    assert grad.args == ()
    assert grad.kwargs == {}
    assert grad.phase == "train"
    for record in cap.records:
        if record.kind != "input":
            reference = expected[(record.module, record.kind)].norm()
            assert torch.equal(record.value["norm"], reference)
        assert record.value["step"] == 0
    with pytest.raises(AttributeError):
        forward.name = "changed"  # frozen


def test_stash_and_stash_value_are_checked():
    model = _model()
    with pytest.raises(ValueError, match="stash, stash_value: give one of them"):
        layerscope.capture(model, stash=lambda e: e.value, stash_value=lambda t: t)
    with pytest.raises(TypeError, match="stash: expected a callable"):
        layerscope.capture(model, stash="norm")


def test_a_reduction_of_a_value_that_is_no_tensor_is_a_counted_failure():
    model = _model()
    cap = layerscope.capture(model, reduction="sum", stash_value=lambda t: 1.0)
    with pytest.warns(layerscope.LayerscopeWarning, match="reduction: folds tensors"):
        model(torch.randn(3, 4)).sum().backward()
    cap.close()
    assert cap.records == []
    assert cap.failures == 6


def test_in_a_run_stash_value_must_return_a_tensor():
    pytest.importorskip("safetensors")
    model = _model()
    tensors = {"include": "^0$", "kinds": "activation", "stash_value": lambda t: 1.0}
    scope = layerscope.watch(model, every=1, tensors=tensors)
    with pytest.warns(layerscope.LayerscopeWarning, match="expected a function returning a"):
        model(torch.randn(3, 4)).sum().backward()
    scope.close()
    assert len(scope.tensors) == 0


VALUES = [
    0.25,
    float("nan"),
    float("-inf"),
    7,
    True,
    None,
    "text",
    (torch.arange(3), 1.5),
    [torch.ones(2, dtype=torch.bfloat16), {"a": None, "b": [1, 2.0]}],
    {"nested": ({"deep": torch.tensor(5)},)},
]


def _same(a: object, b: object) -> bool:
    if isinstance(a, Tensor):
        return isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_values_that_are_no_tensors_round_trip_through_save_and_load(tmp_path):
    pytest.importorskip("safetensors")
    model = nn.Linear(2, 2)
    values = iter(VALUES)
    with layerscope.capture(model, kinds="activation", stash_value=lambda t: next(values)) as cap:
        for _ in VALUES:
            model(torch.ones(1, 2))
            cap.step()
    assert cap.failures == 0
    cap.save(tmp_path / "saved")
    loaded = layerscope.load_capture(tmp_path / "saved")
    assert len(loaded) == len(VALUES)
    for original, back in zip(cap.records, loaded.records, strict=True):
        assert original.metadata() == back.metadata()
        assert _same(original.value, back.value), (original.value, back.value)
    index = json.loads((tmp_path / "saved" / "capture.json").read_text())
    assert index["version"] == 2
    assert "NaN" not in (tmp_path / "saved" / "capture.json").read_text()  # strict JSON
    # Saved again from what was loaded: the same files' worth.
    loaded.save(tmp_path / "again")
    again = layerscope.load_capture(tmp_path / "again")
    assert all(_same(a.value, b.value) for a, b in zip(loaded, again, strict=True))


def test_a_capture_of_tensors_only_is_saved_as_before(tmp_path):
    pytest.importorskip("safetensors")
    model = nn.Linear(2, 2)
    with layerscope.capture(model) as cap:
        model(torch.ones(1, 2)).sum().backward()
    cap.save(tmp_path)
    index = json.loads((tmp_path / "capture.json").read_text())
    assert index["version"] == 1
    assert all(set(entry) >= {"file", "key"} and "value" not in entry for entry in index["records"])


def test_an_object_that_cannot_be_saved_is_named(tmp_path):
    pytest.importorskip("safetensors")
    model = nn.Linear(2, 2)
    with layerscope.capture(model, kinds="activation", stash_value=lambda t: {1, 2}) as cap:
        model(torch.ones(1, 2))
    assert cap.records[0].value == {1, 2}  # kept in memory as it is
    with pytest.raises(TypeError, match=r"save: record 0 .*type set cannot be saved"):
        cap.save(tmp_path / "saved")
    assert not (tmp_path / "saved" / "capture.json").exists()
