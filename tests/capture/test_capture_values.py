"""Captured values are those an independent hook sees, compact, detached, well labelled."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.fixtures import zoo
from torch import Tensor, nn

import layerscope


class Split(nn.Module):
    """Returns a tuple: two halves of a linear map, the second scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 8)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.proj(x)
        return h[:, :4], h[:, 4:] * 3


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.split = Split()
        self.head = nn.Linear(4, 1)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.split(x)
        return self.head(a).sum() + (b**2).sum()


def _inplace_net() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(inplace=True), nn.Linear(7, 3))


def _reference(model: nn.Module, names: list[str], run) -> dict[tuple[str, str, str], Tensor]:
    """Outputs and output gradients seen by plain hooks written here."""
    seen: dict[tuple[str, str, str], Tensor] = {}
    handles = []
    modules = dict(model.named_modules())
    for name in names:

        def forward_hook(module, args, output, name=name):
            outputs = output if isinstance(output, tuple) else (output,)
            for index, tensor in enumerate(outputs):
                label = "out" if not isinstance(output, tuple) else f"out.{index}"
                seen[(name, "activation", label)] = tensor.detach().clone()

                def grad_hook(grad, label=label):
                    seen[(name, "grad", label)] = grad.clone()

                tensor.register_hook(grad_hook)

        handles.append(modules[name].register_forward_hook(forward_hook))
    try:
        run(model)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _captured(cap) -> dict[tuple[str, str, str], Tensor]:
    return {(r.module, r.kind, r.tensor): r.value for r in cap.records}


@pytest.mark.parametrize(
    ("build", "names", "shape"),
    [(_inplace_net, ["0", "1", "2"], (9, 5)), (TupleNet, ["split", "head"], (9, 6))],
    ids=["inplace_relu", "tuple_outputs"],
)
def test_values_equal_an_independent_hooks(build, names, shape):
    torch.manual_seed(0)
    model = build()
    x = torch.randn(*shape)

    def run(m):
        m(x).sum().backward()

    reference = _reference(copy.deepcopy(model), names, run)
    with layerscope.capture(model, include=[f"^{n}$" for n in names]) as cap:
        run(model)
    got = _captured(cap)
    assert got.keys() == reference.keys()
    assert len(got) == 6  # an output and its gradient per tensor
    for key, value in reference.items():
        assert torch.equal(got[key], value), key


def test_inplace_relu_leaves_the_linear_output_and_its_gradient_as_they_were():
    torch.manual_seed(0)
    model = _inplace_net()
    x = torch.randn(16, 5)
    with layerscope.capture(model, include="^0$") as cap:
        model(x).sum().backward()
    got = _captured(cap)
    # Independent computation: the same weights with an out-of-place ReLU.
    plain = copy.deepcopy(model)
    plain[1] = nn.ReLU()
    h = plain[0](x)
    h.retain_grad()
    plain[2](plain[1](h)).sum().backward()
    assert (got[("0", "activation", "out")] < 0).any()  # copied before ReLU changed it
    assert torch.equal(got[("0", "activation", "out")], h.detach())
    assert torch.equal(got[("0", "grad", "out")], h.grad)


def test_values_are_detached_and_compact_even_when_a_view_of_a_batch():
    class Rows(nn.Module):
        def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
            return x[3], x.t()[:, :2]  # a row of a big batch; a strided view

    big = torch.randn(1000, 50, requires_grad=True)
    model = nn.Sequential(nn.Identity(), Rows())
    with layerscope.capture(model, include="^1$", kinds=("activation", "input")) as cap:
        row, cols = model(big * 1.0)
        (row.sum() + cols.sum()).backward()
    values = {r.tensor: r.value for r in cap.records}
    assert set(values) == {"in.x", "out.0", "out.1"}
    for name, value in values.items():
        assert value.grad_fn is None, name
        assert not value.requires_grad, name
        assert value.untyped_storage().nbytes() == value.numel() * value.element_size(), name
    assert torch.equal(values["out.0"], big[3].detach())
    assert torch.equal(values["out.1"], big.detach().t()[:, :2])
    assert values["out.0"].untyped_storage().nbytes() == 50 * 4


def test_inputs_are_copied_before_an_inplace_module_changes_them():
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True))
    x = torch.randn(32, 4)
    with layerscope.capture(model, include="^1$", kinds="input") as cap:
        out = model(x)
    (record,) = cap.records
    assert (record.kind, record.tensor) == ("input", "in.input")
    assert (record.value < 0).any()
    assert not (out < 0).any()
    assert torch.equal(record.value.clamp(min=0), out.detach())


def test_inputs_alone_count_their_calls():
    model = nn.Linear(2, 2)
    with layerscope.capture(model, kinds="input") as cap:
        model(model(torch.randn(1, 2)))
    assert [(r.kind, r.call) for r in cap.records] == [("input", 0), ("input", 1)]


def test_steps_phases_and_calls_label_each_record():
    model = nn.Sequential(nn.Linear(3, 3))
    shared = model[0]
    with layerscope.capture(model, include="^0$", kinds="activation") as cap:
        for _ in range(2):
            shared(shared(torch.randn(2, 3)))  # two calls in one step
            cap.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 3))
    labels = [(r.step, r.phase, r.call) for r in cap.records]
    train = [(step, "train", call) for step in (0, 1) for call in (0, 1)]
    assert labels == [*train, (2, "eval", 0)]
    assert {r.type for r in cap.records} == {"Linear"}


def test_every_keeps_every_nth_step_and_hooks_only_those():
    model = nn.Linear(2, 2)
    with layerscope.capture(model, every=3, kinds="activation") as cap:
        hooked = []
        for _ in range(7):
            hooked.append(len(model._forward_hooks))
            model(torch.randn(1, 2))
            cap.step()
    assert [r.step for r in cap.records] == [0, 3, 6]
    assert hooked == [1, 0, 0, 1, 0, 0, 1]


def test_gradients_belong_to_the_step_of_their_forward():
    model = nn.Linear(2, 2)
    with layerscope.capture(model) as cap:
        out = model(torch.randn(3, 2))
        cap.step()  # before backward: the gradient is still step 0's
        out.sum().backward()
    assert [(r.kind, r.step) for r in cap.records] == [("activation", 0), ("grad", 0)]


def test_a_deepcopy_of_the_model_is_not_captured_and_copies_cleanly():
    model = nn.Sequential(nn.Linear(2, 2))
    with layerscope.capture(model, kinds="activation") as cap:
        ema = copy.deepcopy(model)
        ema(torch.randn(1, 2))
        model(torch.randn(1, 2))
    assert len(cap.records) == 1


def test_stash_value_maps_the_tensor_before_it_is_kept():
    model = nn.Linear(4, 3)
    x = torch.randn(10, 4)
    with layerscope.capture(model, stash_value=lambda t: t.std(dim=0)) as cap:
        out = model(x)
        out.sum().backward()
    activation, grad = cap.records
    assert torch.equal(activation.value, out.detach().std(dim=0))
    assert torch.equal(grad.value, torch.ones(10, 3).std(dim=0))


def test_device_none_keeps_values_where_they_are():
    model = nn.Linear(2, 2).to(torch.float64)
    with layerscope.capture(model, device=None, kinds="activation") as cap:
        model(torch.randn(1, 2, dtype=torch.float64))
    assert cap.records[0].value.device.type == "cpu"
    assert cap.records[0].value.dtype == torch.float64


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_every_zoo_model_is_captured_without_a_failure(name):
    built = zoo.ZOO[name]()
    kinds = ("activation", "grad", "input")
    with layerscope.capture(built.model, kinds=kinds, include=".*") as cap:
        for seed in range(2):
            built.loss(built.model(*built.make_batch(seed))).backward()
            cap.step()
    assert cap.failures == 0
    assert {r.kind for r in cap.records} == set(kinds)
    for record in cap.records:
        value = record.value
        assert value.grad_fn is None
        assert value.untyped_storage().nbytes() == value.numel() * value.element_size()


def test_inputs_are_named_as_watch_names_them():
    class Gate(nn.Module):
        def forward(self, x: Tensor, *rest: Tensor, mask: Tensor | None = None) -> Tensor:
            return x * mask if mask is not None else x + sum(rest)

    model = nn.Sequential(Gate())
    x, y, mask = torch.randn(2, 3), torch.randn(2, 3), torch.ones(2, 3)
    with layerscope.capture(model, include="^0$", kinds="input") as cap:
        model[0](x, y)
        model[0](x, mask=mask)
    with layerscope.watch(model, every=1, kinds=["input"], include="^0$") as scope:
        model[0](x, y)
        model[0](x, mask=mask)
        scope.step()
    captured = [(r.call, r.tensor) for r in cap.records]
    assert captured == [(0, "in.x"), (0, "in.1"), (1, "in.x"), (1, "in.mask")]
    assert set(scope.frame()["tensor"]) == {name for _, name in captured}
