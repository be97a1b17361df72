"""Steps without asking: watch() given no optimizer follows the one that steps the model."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pandas as pd
import pytest
import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

import layerscope
from layerscope import LayerscopeWarning


def _model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batches(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(16, 4, generator=generator) for _ in range(count)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[torch.Tensor]) -> None:
    for batch in batches:
        model(batch).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _stats(frame: pd.DataFrame) -> pd.DataFrame:
    keys = ["step", "phase", "module", "kind", "tensor", "call"]
    columns = [*keys, "numel", "mean", "std", "min", "max", "l2"]
    return frame[columns].sort_values(keys).reset_index(drop=True)


def test_a_loop_that_never_ends_a_step_records_one_step_per_optimizer_step() -> None:
    batches = _batches(5)
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with layerscope.watch(model, every=1) as scope:
        _train(model, sgd, batches)
    followed = scope.frame()

    given_model = _model()
    given_sgd = torch.optim.SGD(given_model.parameters(), lr=0.1, momentum=0.9)
    with layerscope.watch(given_model, given_sgd, every=1) as given:
        _train(given_model, given_sgd, batches)

    assert scope.current_step == 5
    assert sorted(followed["step"].unique()) == [0, 1, 2, 3, 4]
    # What it records is what optimizer= records: gradients before the step, weights after.
    pd.testing.assert_frame_equal(_stats(followed), _stats(given.frame()))


def test_each_steps_gradient_is_that_iterations_against_float64() -> None:
    batches = _batches(3)
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = _model().double()
    with layerscope.watch(model, every=1) as scope:
        for step, batch in enumerate(batches):
            model(batch).pow(2).mean().backward()
            reference(batch.double()).pow(2).mean().backward()
            expected = reference[0].weight.grad.norm().item()
            sgd.step()
            sgd.zero_grad()
            with torch.no_grad():
                for param in reference.parameters():
                    param -= 0.1 * param.grad
                    param.grad = None
            scope.flush()
            rows = scope.frame().query("kind == 'weight_grad' and module == '0'")
            rows = rows[(rows.tensor == "weight") & (rows.step == step)]
            assert len(rows) == 1
            assert rows["l2"].iloc[0] == pytest.approx(expected, rel=1e-5)


def test_training_is_bit_identical_watched_and_not() -> None:
    batches = _batches(4)
    plain = _model()
    _train(plain, torch.optim.Adam(plain.parameters(), lr=0.01), batches)
    watched = _model()
    with layerscope.watch(watched, every=1):
        _train(watched, torch.optim.Adam(watched.parameters(), lr=0.01), batches)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_process_wide_hooks_are_gone_after_close() -> None:
    before = (
        len(torch_optimizer._global_optimizer_pre_hooks),
        len(torch_optimizer._global_optimizer_post_hooks),
    )
    model = _model()
    scope = layerscope.watch(model, every=1)
    assert len(torch_optimizer._global_optimizer_pre_hooks) == before[0] + 1
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches(2))
    scope.close()
    after = (
        len(torch_optimizer._global_optimizer_pre_hooks),
        len(torch_optimizer._global_optimizer_post_hooks),
    )
    assert after == before


def test_a_loop_that_calls_step_after_the_optimizer_gets_its_scalars_on_its_steps() -> None:
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, every=1) as scope:
        for step, batch in enumerate(_batches(4)):
            model(batch).pow(2).mean().backward()
            sgd.step()
            sgd.zero_grad()
            scope.step(loss=float(step))
    scalars = scope.frame("scalars")
    assert scalars[["step", "value"]].values.tolist() == [[0, 0.0], [1, 1.0], [2, 2.0], [3, 3.0]]
    assert sorted(scope.frame()["step"].unique()) == [0, 1, 2, 3]


def test_a_loop_that_ends_its_steps_before_the_optimizer_steps_is_not_followed() -> None:
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, every=1) as scope:
        for step, batch in enumerate(_batches(3)):
            model(batch).pow(2).mean().backward()
            scope.step(loss=float(step))  # ends the step: the optimizer's is not a second one
            sgd.step()
            sgd.zero_grad()
    assert scope.current_step == 3
    assert scope.frame("scalars")["step"].tolist() == [0, 1, 2]
    grads = scope.frame().query("kind == 'weight_grad'")
    assert sorted(grads["step"].unique()) == [0, 1, 2]


def test_accumulated_micro_batches_are_one_step_of_the_followed_optimizer() -> None:
    batches = _batches(6)
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = _model().double()
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerscopeWarning)  # no warning: steps are followed
        with layerscope.watch(model, every=1) as scope:
            for window in (batches[:3], batches[3:]):
                for batch in window:
                    model(batch).pow(2).mean().backward()
                sgd.step()
                sgd.zero_grad()
    for batch in batches[:3]:
        reference(batch.double()).pow(2).mean().backward()
    rows = scope.frame().query("kind == 'weight_grad' and module == '2' and tensor == 'weight'")
    assert rows["step"].tolist() == [0, 1]
    assert rows["l2"].iloc[0] == pytest.approx(reference[2].weight.grad.norm().item(), rel=1e-5)


def test_a_frozen_backbone_does_not_keep_the_head_optimizer_from_being_followed() -> None:
    model = _model()
    model[0].requires_grad_(False)
    sgd = torch.optim.SGD(model[2].parameters(), lr=0.1)
    with layerscope.watch(model, every=1) as scope:
        _train(model, sgd, _batches(3))
    assert scope.current_step == 3


def test_an_optimizer_of_another_model_is_not_followed() -> None:
    generator, critic = _model(0), _model(1)
    critic_sgd = torch.optim.SGD(critic.parameters(), lr=0.1)
    generator_sgd = torch.optim.SGD(generator.parameters(), lr=0.1)
    with layerscope.watch(generator, every=1) as scope:
        for batch in _batches(3):
            critic(batch).mean().backward()
            critic_sgd.step()  # first in each iteration, and steps nothing watched
            critic_sgd.zero_grad()
            generator(batch).mean().backward()
            generator_sgd.step()
            generator_sgd.zero_grad()
    assert scope.current_step == 3
    assert scope.frame().query("kind == 'activation'")["step"].tolist() == [
        0,
        0,
        0,
        1,
        1,
        1,
        2,
        2,
        2,
    ]


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator, self.critic = _model(0), _model(1)


def test_two_optimizers_of_one_model_are_not_followed_and_step_ends_the_steps() -> None:
    pair = _Pair()
    optimizers = [
        torch.optim.SGD(part.parameters(), lr=0.1) for part in (pair.critic, pair.generator)
    ]
    with layerscope.watch(pair, every=1) as scope:
        for step, batch in enumerate(_batches(3)):
            for part, optimizer in zip((pair.critic, pair.generator), optimizers, strict=True):
                part(batch).mean().backward()
                optimizer.step()  # half an iteration: following it would split each
                optimizer.zero_grad()
            scope.step(loss=float(step))
    assert scope.current_step == 3
    steps = scope.frame().query("kind == 'activation' and module == 'critic.0'")["step"]
    assert steps.tolist() == [0, 1, 2]


def _warnings_of(train: Callable[[], None]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train()
    return [str(w.message) for w in caught if issubclass(w.category, LayerscopeWarning)]


def test_two_optimizers_without_a_step_call_warn_once_that_iterations_merge() -> None:
    pair = _Pair()
    optimizers = [
        torch.optim.Adam(pair.critic.parameters()),
        torch.optim.SGD(pair.generator.parameters(), lr=0.1),
    ]
    scope = layerscope.watch(pair, every=1)

    def train() -> None:
        with scope:
            for batch in _batches(3):
                for part, optimizer in zip((pair.critic, pair.generator), optimizers, strict=True):
                    part(batch).mean().backward()
                    optimizer.step()
                    optimizer.zero_grad()

    messages = _warnings_of(train)
    assert len(messages) == 1
    assert "every iteration so far is step 0" in messages[0]
    assert "optimizers (Adam, SGD) each step only part of the watched" in messages[0]
    assert scope.current_step == 0


def test_a_hand_written_update_without_step_calls_warns_once() -> None:
    model = _model()

    def train() -> None:
        with layerscope.watch(model, every=1):
            for batch in _batches(4):
                model(batch).pow(2).mean().backward()
                with torch.no_grad():
                    for param in model.parameters():
                        param -= 0.1 * param.grad
                        param.grad = None

    messages = _warnings_of(train)
    assert len(messages) == 1
    assert "Call scope.step() once per iteration" in messages[0]


def test_a_given_optimizer_leaves_no_process_wide_hook() -> None:
    before = len(torch_optimizer._global_optimizer_pre_hooks)
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, sgd, every=1):
        assert len(torch_optimizer._global_optimizer_pre_hooks) == before
