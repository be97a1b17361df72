"""``stats={kind: {name: fn}}``: custom statistics of some kinds only, checked in float64."""

import numpy as np
import pytest
import torch
from torch import nn

import layerscope

KINDS = ("activation", "input", "grad", "weight")


def mean_abs(t):
    return t.abs().mean()


def rms(t):
    return t.float().pow(2).mean().sqrt()


def sum_abs(t):
    return t.abs().sum()


def norm(t):
    return t.norm()


# l1 for every kind, but weights have their own l1; rms only of activations, norm of weights.
STATS = [
    "mean",
    {"l1": mean_abs},
    {"activation": {"rms": rms}, "weight": {"l1": sum_abs, "norm": norm}},
]
EXPECTED_FNS = {
    "activation": {"l1": lambda a: np.abs(a).mean(), "rms": lambda a: np.sqrt((a * a).mean())},
    "input": {"l1": lambda a: np.abs(a).mean()},
    "grad": {"l1": lambda a: np.abs(a).mean()},
    "weight": {"l1": lambda a: np.abs(a).sum(), "norm": lambda a: np.sqrt((a * a).sum())},
}


def train_one_step(run=None):
    """One recorded step; the tensors themselves, kept by hooks of our own, in float64."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}

    def keep(name):
        def hook(module, args, out):
            seen[name, "input", "in.input"] = args[0].detach().double().numpy()
            seen[name, "activation", "out"] = out.detach().double().numpy()

            def keep_grad(grad):
                seen[name, "grad", "out"] = grad.double().numpy()  # returns None: grad unchanged

            out.register_hook(keep_grad)

        return hook

    for name, module in model.named_children():
        module.register_forward_hook(keep(name))
    with layerscope.watch(
        model, optimizer=optimizer, every=1, kinds=KINDS, stats=STATS, alerts=False, run=run
    ) as scope:
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, module in model.named_children():
        for tensor, parameter in module.named_parameters():
            seen[name, "weight", tensor] = parameter.detach().double().numpy()
    return scope, seen


def check_values(frame, seen):
    assert len(frame) == len(seen)
    for row in frame.itertuples(index=False):
        expected = EXPECTED_FNS[row.kind]
        tensor = seen[row.module, row.kind, row.tensor]
        for name in ("l1", "rms", "norm"):
            value = getattr(row, name)
            if name in expected:
                assert value == pytest.approx(expected[name](tensor), rel=1e-5), (row, name)
            else:  # a kind without it: null
                assert value is None or np.isnan(value), (row, name)


def test_each_kind_gets_its_own_custom_statistics_in_memory():
    scope, seen = train_one_step()
    frame = scope.frame()
    assert list(frame.columns[-3:]) == ["l1", "rms", "norm"]  # every kind's first
    check_values(frame, seen)


def test_each_kind_gets_its_own_custom_statistics_stored(tmp_path):
    _, seen = train_one_step(tmp_path / "run")
    run = layerscope.load(tmp_path / "run")
    check_values(run.stats, seen)
    counted = run.sql("select kind, count(rms) r, count(norm) n, count(l1) l from stats group by 1")
    counts = {row.kind: (row.r, row.n, row.l) for row in counted.itertuples()}
    # 3 modules: Linear, Tanh, Linear; weights of the Linears only (weight and bias).
    assert counts == {
        "activation": (3, 0, 3),
        "input": (0, 0, 3),
        "grad": (0, 0, 3),
        "weight": (0, 4, 4),
    }
    config = run.meta["config"]
    assert config["custom_stats"] == ["l1", "rms", "norm"]
    assert config["custom_stats_by_kind"] == {"activation": ["rms"], "weight": ["l1", "norm"]}


def test_a_shared_tensor_gets_each_kinds_statistics():
    """Tanh's input is the first Linear's output: one row of partials, custom stats per kind."""
    scope, seen = train_one_step()
    frame = scope.frame().set_index(["module", "kind"])
    assert np.isnan(frame.loc[("1", "input"), "rms"])
    assert frame.loc[("0", "activation"), "rms"] == pytest.approx(
        np.sqrt((seen["0", "activation", "out"] ** 2).mean()), rel=1e-5
    )
    assert frame.loc[("1", "input"), "l1"] == frame.loc[("0", "activation"), "l1"]


def test_a_kind_not_captured_is_refused():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"stats: statistics for 'input', which kinds="):
        layerscope.watch(model, stats={"input": {"rms": rms}})
