"""examples/migrating/from_torchfunc.py: what it prints and saves, against plain autograd.

The reference trains the example's model (same seed, data and SGD step) with no hook at all,
calling its layers one by one and asking ``torch.autograd.grad`` for the gradient of the loss
with respect to each Linear's input and output. The other scripts under examples/migrating/
run in tests/test_examples.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import layerscope
from tests.test_examples import run_example as untyped_run_example

pytest.importorskip("safetensors")

STEPS = 4
LINEARS = ("0", "2", "4")

Key = tuple[int, str, str, str]  # step, module, kind, tensor
Example = tuple[str, Path]  # what it printed, the folder it wrote in

# tests/test_examples.py leaves it unannotated; what it returns is the script's stdout.
run_example: Callable[..., str] = untyped_run_example


def reference() -> tuple[dict[Key, Tensor], dict[str, list[Tensor]]]:
    """Each step's Linear inputs, outputs and their gradients; each step's ReLU outputs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    kept: dict[Key, Tensor] = {}
    relu_outputs: dict[str, list[Tensor]] = {"1": [], "3": []}
    for step in range(STEPS):
        h = x.clone().requires_grad_()
        seen = []  # (module, its input, its output)
        for name, layer in model.named_children():
            out = layer(h)
            seen.append((name, h, out))
            h = out
        loss = (h - y).pow(2).mean()
        tensors = [t for _, inp, out in seen for t in (inp, out)]
        grads = torch.autograd.grad(loss, tensors, retain_graph=True)
        for (name, inp, out), g_in, g_out in zip(seen, grads[::2], grads[1::2], strict=True):
            if name in LINEARS:
                kept[(step, name, "input", "in.input")] = inp.detach()
                kept[(step, name, "activation", "out")] = out.detach()
                kept[(step, name, "grad", "out")] = g_out
                kept[(step, name, "input_grad", "in.input")] = g_in
            else:
                relu_outputs[name].append(out.detach())
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
        with torch.no_grad():  # SGD(lr=0.1)'s step, written out
            for param in model.parameters():
                assert param.grad is not None
                param.add_(param.grad, alpha=-0.1)
                param.grad = None
    return kept, relu_outputs


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Example:
    """The example's output and folder, run once for the tests below."""
    out_dir = tmp_path_factory.mktemp("torchfunc")
    return run_example("migrating/from_torchfunc.py", "--out", out_dir, cwd=out_dir), out_dir


def test_torchfunc_example_prints_the_modules_shapes_and_counts_worked_out_here(
    example: Example,
) -> None:
    out, _ = example
    lines = out.splitlines()
    assert lines[:2] == ["Linears captured: ['0', '2', '4']", "after remove(0): ['2', '4']"]
    # The first Linear maps (16, 4) to (16, 8); the data asked for a gradient.
    assert lines[2:6] == [
        "step 0, Linear 0: activation out (16, 8)",
        "step 0, Linear 0: input in.input (16, 4)",
        "step 0, Linear 0: grad out (16, 8)",
        "step 0, Linear 0: input_grad in.input (16, 4)",
    ]
    # Three Linears, four kinds each; the last step after remove(0): two Linears.
    assert "records per step: [12, 12, 12, 8]" in lines
    # Steps 0 and 2 of 0..3 are even: two outputs summed.
    for relu in ("1", "3"):
        assert f"ReLU {relu}: sum of 2 outputs (16, 8), the last at step 2" in lines
    assert lines[-2:] == [
        f"linears: {3 * 4 * 3 + 2 * 4} records read back as kept",
        "relus: 2 records read back as kept",
    ]


def test_torchfunc_example_keeps_what_autograd_gives_bit_for_bit(example: Example) -> None:
    out, out_dir = example
    kept, relu_outputs = reference()
    first = kept[(0, "0", "input_grad", "in.input")]
    match = re.search(r"Linear 0: input_grad l2 ([\d.]+)\n", out)
    assert match is not None
    printed = float(match.group(1))
    assert printed == pytest.approx(first.double().norm().item(), abs=1e-6)

    linears = layerscope.load_capture(out_dir / "linears")
    got = {(r.step, r.module, r.kind, r.tensor): r.value for r in linears.records}
    expected = {key for key in kept if not (key[0] == STEPS - 1 and key[1] == "0")}
    assert set(got) == expected  # removed before the last step: none of Linear 0 there
    for key in expected:
        assert torch.equal(got[key], kept[key]), key
    # The first Linear's input_grad is the gradient of the loss with respect to the data.
    assert first.abs().sum() > 0

    relus = {r.module: r for r in layerscope.load_capture(out_dir / "relus").records}
    assert sorted(relus) == ["1", "3"]
    for name, outputs in relu_outputs.items():
        summed = outputs[0].double() + outputs[2].double()  # the even steps
        assert relus[name].count == 2
        torch.testing.assert_close(relus[name].value.double(), summed, rtol=1e-6, atol=0)
