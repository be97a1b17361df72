"""Input rows are named as ``forward`` names its parameters: ``in.x``; ``in.0`` where unbound."""

import inspect

import pytest
import torch
from torch import nn

import layerscope
from layerscope.hooks import _values


class TwoInputs(nn.Module):
    def forward(self, x, y, mask=None):
        return x + y if mask is None else (x + y) * mask


class Rest(nn.Module):
    def forward(self, x, *rest, **options):
        return x + sum(rest) + sum(options.values())


class Nested(nn.Module):
    def forward(self, pair, flag=True):
        first, named = pair
        return first + named["h"]


class Builtin(nn.Module):
    """A module whose forward has no signature to read."""

    def __init__(self):
        super().__init__()
        self.forward = torch.neg  # a builtin: inspect.signature cannot read it


def input_means(module, *args, **kwargs):
    """{tensor name: mean} of the input rows of one recorded call of ``module``."""
    holder = nn.ModuleDict({"m": module})
    with layerscope.watch(holder, every=1, kinds=("input",), include="^m$") as scope:
        module(*args, **kwargs)
        scope.step()
    frame = scope.frame().query("kind == 'input'")
    return dict(zip(frame.tensor, frame["mean"], strict=True))


def full(value):
    return torch.full((2, 3), float(value))


def test_positional_arguments_take_their_parameters_names():
    assert input_means(TwoInputs(), full(1), full(5)) == {"in.x": 1.0, "in.y": 5.0}
    assert input_means(nn.Linear(3, 2), full(2)) == {"in.input": 2.0}


@pytest.mark.parametrize("as_keyword", [False, True])
def test_a_parameter_is_named_alike_given_by_position_or_keyword(as_keyword):
    args, kwargs = (full(1), full(2)), {"mask": full(3)}
    if not as_keyword:
        args, kwargs = (*args, full(3)), {}
    assert input_means(TwoInputs(), *args, **kwargs) == {"in.x": 1.0, "in.y": 2.0, "in.mask": 3.0}


def test_star_args_keep_their_position_and_star_kwargs_their_keyword():
    means = input_means(Rest(), full(1), full(2), full(3), scale=full(4))
    assert means == {"in.x": 1.0, "in.1": 2.0, "in.2": 3.0, "in.scale": 4.0}


def test_nested_inputs_are_named_inside_their_parameter():
    means = input_means(Nested(), (full(1), {"h": full(2)}))
    assert means == {"in.pair.0": 1.0, "in.pair.1.h": 2.0}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.trace is deprecated
def test_a_forward_without_a_signature_keeps_positions():
    assert input_means(Builtin(), full(7)) == {"in.0": 7.0}
    traced = torch.jit.trace(nn.Linear(3, 2), full(1))
    names = _values.InputNames(traced)
    assert [name for name, _ in names.named((full(1),), {})] == ["in.0"]


def test_each_forward_is_read_once_not_per_call(monkeypatch):
    read = []
    signature = inspect.signature
    monkeypatch.setattr(_values.inspect, "signature", lambda f: read.append(f) or signature(f))
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Tanh())
    with layerscope.watch(model, every=1, kinds=("input", "activation")) as scope:
        for _ in range(3):
            model(full(1))
            scope.step()
    assert len(read) == 2  # Linear.forward (shared by both) and Tanh.forward
    assert set(scope.frame().query("kind == 'input'").tensor) == {"in.input"}
