"""The loss's autograd graph read once: probabilities fed to a loss that expects logits."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import layerscope
from layerscope.health import WRONG_LOSS_SCALAR
from layerscope.hooks._loss_graph import wrong_losses

Loss = Callable[[Tensor, Tensor], Tensor]


class Classifier(nn.Module):
    """(8, 4) -> fc -> act -> out -> (8, 3), then ``last`` (an activation or nothing)."""

    def __init__(self, last: nn.Module | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.out = nn.Linear(8, 3)
        self.last = last

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.out(self.act(self.fc(x)))
        return y if self.last is None else self.last(y)


def _classes(output: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(output, target)


def _bits(output: Tensor, target: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(output, F.one_hot(target, 3).float())


def _train(
    model: nn.Module, loss_of: Loss, steps: int = 2, every: int | None = None, passed=None
) -> tuple[list[tuple[int, str, float]], list[tuple[int, str, str, str]]]:
    """Train ``model`` watched; ``passed(step, loss)`` is what ``scope.step`` gets as loss.

    Returns the ``wrong_loss`` scalars (step, name, value) and alerts (step, rule, module,
    severity).
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    with layerscope.watch(model, optimizer=optimizer, run=None, every=every) as scope:
        for step in range(steps):
            loss = loss_of(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss if passed is None else passed(step, loss))
    scalars = scope.frame("scalars")
    found = [
        (int(s.step), str(s.name), float(s.value))
        for s in scalars.itertuples()
        if str(s.name).startswith(WRONG_LOSS_SCALAR)
    ]
    alerts = scope.frame("alerts")
    said = [
        (int(a.step), str(a.rule), str(a.module), str(a.severity))
        for a in alerts.itertuples()
        if a.rule == "wrong_loss"
    ]
    return found, said


def test_a_softmax_fed_to_cross_entropy_is_named_once_and_training_is_unchanged():
    model = Classifier(nn.Softmax(dim=-1))
    twin = copy.deepcopy(model)
    found, said = _train(model, _classes, steps=4)
    assert found == [(0, "wrong_loss/last", 1.0)]
    assert said == [(0, "wrong_loss", "last", "warning")]
    # The same training unwatched: the check changed no value.
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    torch.manual_seed(1)
    for _ in range(4):
        _classes(twin(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
        optimizer.step()
        optimizer.zero_grad()
    for watched, unwatched in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(watched, unwatched)


def test_a_sigmoid_fed_to_bce_with_logits_is_named():
    found, said = _train(Classifier(nn.Sigmoid()), _bits)
    assert found == [(0, "wrong_loss/last", 2.0)]
    assert said == [(0, "wrong_loss", "last", "warning")]


def test_a_sigmoid_fed_to_cross_entropy_through_reshapes_and_a_cast_is_named():
    def loss_of(output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output.unsqueeze(0).transpose(0, 1).reshape(8, 3).double(), target)

    found, _ = _train(Classifier(nn.Sigmoid()), loss_of)
    assert found == [(0, "wrong_loss/last", 3.0)]


class _Head(nn.Module):
    """A watched module (it owns a parameter) whose output is its child's: the softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.probs = nn.Softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.probs(x * self.scale)
        return out


def test_the_innermost_module_that_returned_the_probability_is_named():
    found, _ = _train(Classifier(_Head()), _classes)
    assert found == [(0, "wrong_loss/last.probs", 1.0)]


class _FunctionalSoftmax(Classifier):
    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(super().forward(x), dim=-1).view(8, 3)


def test_a_softmax_in_the_models_own_forward_names_the_model():
    found, said = _train(_FunctionalSoftmax(), _classes)
    assert found == [(0, "wrong_loss/", 1.0)]
    assert said == [(0, "wrong_loss", "", "warning")]


def _log_probs(output: Tensor, target: Tensor) -> Tensor:
    return F.nll_loss(output, target)


def _bce(output: Tensor, target: Tensor) -> Tensor:
    return F.binary_cross_entropy(output, F.one_hot(target, 3).float())


@pytest.mark.parametrize(
    ("last", "loss_of"),
    [
        (None, _classes),  # logits to cross_entropy
        (None, _bits),  # logits to BCE with logits
        (nn.Sigmoid(), _bce),  # probabilities to BCELoss
        (nn.LogSoftmax(dim=-1), _log_probs),  # log-probabilities to nll_loss
        (nn.LogSoftmax(dim=-1), _classes),  # log_softmax twice is log_softmax
    ],
)
def test_a_loss_given_what_it_expects_is_no_finding(last: nn.Module | None, loss_of: Loss):
    assert _train(Classifier(last), loss_of) == ([], [])


def test_a_loss_passed_without_its_graph_is_not_read():
    model = Classifier(nn.Softmax(dim=-1))
    assert _train(model, _classes, passed=lambda step, loss: loss.detach()) == ([], [])
    assert _train(model, _classes, passed=lambda step, loss: loss.item()) == ([], [])


def test_the_check_waits_for_a_recorded_step_with_the_loss_graph():
    # Detached until step 3; step 3 and 4 are not recorded (every=5): read at step 5.
    def passed(step: int, loss: Tensor) -> Tensor:
        return loss if step >= 3 else loss.detach()

    found, _ = _train(Classifier(nn.Softmax(dim=-1)), _classes, steps=7, every=5, passed=passed)
    assert found == [(5, "wrong_loss/last", 1.0)]


def test_a_graph_without_the_models_outputs_is_no_finding():
    # A softmax fed to cross_entropy, outside any watched module: no tag, no finding.
    probs = torch.softmax(torch.randn(8, 3, requires_grad=True), dim=-1)
    assert wrong_losses(F.cross_entropy(probs, torch.randint(0, 3, (8,)))) == {}
    model = Classifier()
    other = Classifier(nn.Softmax(dim=-1))  # not watched

    def loss_of(output: Tensor, target: Tensor) -> Tensor:
        return _classes(output, target) + _classes(other(torch.randn(8, 4)), target)

    assert _train(model, loss_of) == ([], [])


def test_a_graph_that_cannot_be_read_is_a_warning_and_training_goes_on(monkeypatch):
    def unreadable(loss: Tensor) -> dict[str, int]:
        raise RuntimeError("no graph")

    monkeypatch.setattr("layerscope.hooks._loss_graph.wrong_losses", unreadable)
    with pytest.warns(layerscope.LayerscopeWarning, match="reading the loss's autograd graph"):
        found, said = _train(Classifier(nn.Softmax(dim=-1)), _classes)
    assert (found, said) == ([], [])
