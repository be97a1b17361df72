"""Input rows' built-in statistics against float64, as tests/test_zoo.py checks the other kinds.

The reference is a forward pre-hook written here that clones each input, positional and
keyword, before the module runs; its statistics and log2 histogram are tests/test_zoo.py's
numpy float64 ones, with its tolerances (moments to 1e-5, extremes and counts exact).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import layerscope
from tests.test_zoo import Entry, row_mismatches, to_numpy


class Gate(nn.Module):
    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return torch.relu(x) * mask


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.gate = Gate()

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        gated: Tensor = self.gate(self.fc(x), mask=mask)
        return gated


def test_input_rows_match_float64_statistics_of_the_inputs_a_pre_hook_sees() -> None:
    torch.manual_seed(0)
    net = Net()
    seen: dict[tuple[int, str, str], Entry] = {}
    step = 0

    def keep(name: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        names = ("in.input",) if name == "fc" else ("in.x",)
        named = [*zip(names, args, strict=True), *((f"in.{k}", v) for k, v in kwargs.items())]
        for tensor, value in named:
            entry = Entry(type(module).__name__, "float32", tuple(value.shape), [to_numpy(value)])
            seen[(step, name, tensor)] = entry

    for name in ("fc", "gate"):
        net.get_submodule(name).register_forward_pre_hook(
            lambda m, a, k, name=name: keep(name, m, a, k), with_kwargs=True
        )
    with layerscope.watch(net, every=1, kinds=["input"]) as scope:
        for step in range(2):  # noqa: B007  # the hook reads it
            x = torch.randn(8, 4)
            x[0] = 0.0  # exact zeros: zero_frac is not 0
            mask = (torch.rand(8, 6) > 0.5).float()
            net(x, mask)
            scope.step()
    frame = scope.frame()
    rows = {(r["step"], r["module"], r["tensor"]): r for r in frame.to_dict("records")}
    inputs = (("fc", "in.input"), ("gate", "in.x"), ("gate", "in.mask"))
    assert set(rows) == set(seen) == {(s, *named) for s in (0, 1) for named in inputs}
    problems = [
        f"{key} {line}" for key, entry in seen.items() for line in row_mismatches(rows[key], entry)
    ]
    assert not problems, "\n".join(problems)
    # Exact zeros were there to count: the data's first row, the mask's dropped units.
    zeros = (("fc", "in.input"), ("gate", "in.mask"))
    assert all(rows[(s, *named)]["zero_frac"] > 0 for s in (0, 1) for named in zeros)
