"""A tensor recorded twice in one flush (an output, then the next module's input) is reduced
once and shares its row, unless it changed in place in between."""

import numpy as np
import torch
from torch import nn

import layerscope
from layerscope.recording import _recorder


def _model():
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
    )


def test_inputs_share_the_rows_of_the_outputs_before_them(monkeypatch):
    torch.manual_seed(0)
    model = _model()
    seen = {}  # (module, kind) -> float64 values, from plain hooks

    def keep(name, kind, tensor):
        seen[(name, kind)] = tensor.detach().double().numpy().copy()

    for name, module in model.named_children():
        module.register_forward_pre_hook(lambda m, args, n=name: keep(n, "input", args[0]))
        module.register_forward_hook(lambda m, args, out, n=name: keep(n, "activation", out))
    reductions = []
    real = _recorder.write_partials

    def counting(tensor, histogram, rows, index):
        reductions.append(tensor.shape)
        real(tensor, histogram, rows, index)

    monkeypatch.setattr(_recorder, "write_partials", counting)
    scope = layerscope.watch(model, every=1, kinds=("input", "activation"))
    model(torch.randn(32, 8))
    scope.step()
    frame = scope.frame()
    scope.close()

    # Five modules, ten readings. Reduced: the model's input, each Linear's output, ReLU's
    # output (the same tensor as Linear 0's, changed in place) and Tanh's: 6 of 10.
    assert len(frame) == 10
    assert len(reductions) == 6
    for row in frame.itertuples():
        values = seen[(row.module, row.kind)]
        assert row.numel == values.size
        np.testing.assert_allclose(row.mean, values.mean(), rtol=1e-6, atol=1e-7)
        assert row.min == values.min()
        assert row.max == values.max()
        assert row.zero_frac == np.mean(values == 0)
    # ReLU's input is Linear 0's output before ReLU overwrote it: negative values remain.
    relu_input = frame[(frame.module == "1") & (frame.kind == "input")].iloc[0]
    relu_output = frame[(frame.module == "1") & (frame.kind == "activation")].iloc[0]
    assert relu_input["min"] < 0
    assert relu_output["min"] == 0


def test_rows_are_not_shared_across_steps(monkeypatch):
    model = _model()
    reductions = []
    real = _recorder.write_partials

    def counting(tensor, histogram, rows, index):
        reductions.append(1)
        real(tensor, histogram, rows, index)

    monkeypatch.setattr(_recorder, "write_partials", counting)
    x = torch.randn(4, 8)
    with layerscope.watch(model, every=1, kinds=("input",)) as scope:
        for _ in range(3):
            model(x)  # the same input tensor every step
            scope.step()
        frame = scope.frame()
    # 5 inputs a step, none recorded before within its step; x again each step all the same
    assert len(reductions) == 3 * 5
    assert sorted(frame.step.unique()) == [0, 1, 2]
    first = frame[frame.module == "0"]
    assert len(first) == 3
    assert first["mean"].nunique() == 1
