"""Kind ``input_grad``: the gradient with respect to each module input, through that module.

References: float64 vector-Jacobian products of each module alone (``torch.autograd.functional
.vjp``), and the ``grad_input`` of a full backward hook, which torchfunc's ``BackwardInput``
records.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import layerscope


class Block(nn.Module):
    """A residual block with a mask: two named inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        out = torch.tanh(self.fc(x))
        return out if mask is None else out * mask


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.block = Block()
        self.head = nn.Linear(6, 1)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.embed(x)
        h = h + self.block(h, mask=mask)  # a residual: h has two uses
        return self.head(h)


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _data() -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, generator=generator)
    mask = torch.rand(6, generator=generator).requires_grad_()
    return x, mask


def _rows(frame, module: str) -> dict[str, float]:
    rows = frame[(frame.kind == "input_grad") & (frame.module == module)]
    return dict(zip(rows.tensor, rows.l2, strict=True))


def _float64_references(net: Net) -> dict[tuple[str, str], Tensor]:
    """Each module's input gradients through it alone, in float64, by vjp of the module."""
    net = copy.deepcopy(net).double()
    x, mask = _data()
    x, mask = x.double(), mask.detach().double().requires_grad_()
    h = net.embed(x)
    block_out = net.block(h, mask=mask)
    top = h + block_out
    out = net.head(top)
    g_out = torch.ones_like(out)
    (g_top,) = torch.autograd.grad(out, top, g_out, retain_graph=True)
    _, (g_block_x, g_block_mask) = torch.autograd.functional.vjp(
        lambda a, b: net.block(a, mask=b), (h.detach(), mask.detach()), g_top
    )
    _, g_fc = torch.autograd.functional.vjp(
        net.block.fc, h.detach(), _fc_out_grad(net, h, mask, g_top)
    )
    _, g_head = torch.autograd.functional.vjp(net.head, top.detach(), g_out)
    return {
        ("block", "in.x"): g_block_x,
        ("block", "in.mask"): g_block_mask,
        ("block.fc", "in.input"): g_fc,
        ("head", "in.input"): g_head,
    }


def _fc_out_grad(net: Net, h: Tensor, mask: Tensor, g_top: Tensor) -> Tensor:
    """The gradient reaching the block's Linear output: through tanh and the mask."""
    pre = net.block.fc(h.detach())
    return g_top * mask.detach() * (1 - torch.tanh(pre) ** 2)


def test_each_inputs_gradient_through_its_module_against_float64() -> None:
    net = _net()
    x, mask = _data()
    with layerscope.watch(
        net, every=1, kinds=["input_grad"], include=["block", "block.fc", "head", "embed"]
    ) as scope:
        net(x, mask).sum().backward()
    frame = scope.frame()
    references = _float64_references(net)
    for (module, tensor), expected in references.items():
        assert _rows(frame, module)[tensor] == pytest.approx(expected.norm().item(), rel=1e-5)
    # The residual's two paths: the block's in.x is not the total gradient of h.
    assert not torch.allclose(references[("block", "in.x")], references[("head", "in.input")])
    # The first layer's input needs no gradient: no row, no error.
    assert _rows(frame, "embed") == {}


def test_whole_tensors_equal_a_full_backward_hooks_grad_input() -> None:
    net = _net()
    x, mask = _data()
    with layerscope.capture(net, kinds=["input_grad"], include=["block.fc", "head"]) as cap:
        net(x, mask).sum().backward()
    kept = {(r.module, r.tensor): r.value for r in cap.records}

    reference = _net()
    grad_inputs: dict[str, Tensor] = {}
    for name in ("block.fc", "head"):
        module = reference.get_submodule(name)
        module.register_full_backward_hook(
            lambda m, grad_input, grad_output, name=name: grad_inputs.__setitem__(
                name, grad_input[0]
            )
        )
    reference(x, mask.detach().clone().requires_grad_()).sum().backward()
    assert set(kept) == {("block.fc", "in.input"), ("head", "in.input")}
    for name in ("block.fc", "head"):
        assert torch.equal(kept[(name, "in.input")], grad_inputs[name])


def test_an_input_the_module_changes_in_place_has_no_row_and_training_is_unchanged() -> None:
    def build() -> nn.Sequential:
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))

    x = torch.randn(6, 4)
    plain = build()
    plain(x).sum().backward()
    watched = build()
    with layerscope.watch(watched, every=1, kinds=["input_grad"]) as scope:
        watched(x).sum().backward()
    frame = scope.frame()
    assert sorted(set(frame.module)) == ["2"]  # the ReLU changed its input in place: no row
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_training_is_bit_identical_and_the_hooks_are_gone_after_close() -> None:
    x, mask = _data()

    def train(net: Net, watch: bool) -> None:
        sgd = torch.optim.SGD(net.parameters(), lr=0.1)
        scope = (
            layerscope.watch(net, sgd, every=2, kinds=["input_grad", "activation"])
            if watch
            else None
        )
        for _ in range(4):
            net(x, mask).pow(2).mean().backward()
            sgd.step()
            sgd.zero_grad()
        if scope is not None:
            scope.close()

    plain, watched = _net(), _net()
    train(plain, watch=False)
    train(watched, watch=True)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(not module._forward_pre_hooks for module in watched.modules())


def test_only_recorded_steps_hook_the_inputs() -> None:
    net = _net()
    x, mask = _data()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    hooked_at_call: list[bool] = []
    with layerscope.watch(net, sgd, every=3, kinds=["input_grad"]) as scope:
        # Registered after the watch's own: it sees whether the head carries them as it runs.
        net.head.register_forward_hook(
            lambda *_: hooked_at_call.append(len(net.head._forward_pre_hooks) > 0)
        )
        for _ in range(4):
            net(x, mask).sum().backward()
            sgd.step()
            sgd.zero_grad()
    assert hooked_at_call == [True, False, False, True]
    assert sorted(set(scope.frame().step)) == [0, 3]


def test_evaluation_passes_give_no_rows() -> None:
    net = _net()
    x, mask = _data()
    with layerscope.watch(net, every=1, kinds=["input_grad"]) as scope, torch.no_grad():
        net(x, mask)
    assert scope.frame().empty


def test_a_single_op_modules_input_gradient_is_what_torchfuncs_hook_records() -> None:
    # torchfunc's BackwardInput records the grad_input of the deprecated module backward hook:
    # the gradients of the module's last autograd op, right where the module is one op.
    net = _net()
    x, mask = _data()
    with layerscope.capture(net, kinds=["input_grad"], include="head") as cap:
        net(x, mask).sum().backward()
    (record,) = cap.records

    reference = _net()
    recorded: list[tuple[Tensor | None, ...]] = []
    reference.head.register_backward_hook(
        lambda m, grad_input, grad_output: recorded.append(grad_input)
    )
    reference(x, mask.detach().clone().requires_grad_()).sum().backward()
    (grad_input,) = recorded
    (same_shape,) = [g for g in grad_input if g is not None and g.shape == record.value.shape]
    assert torch.equal(record.value, same_shape)
