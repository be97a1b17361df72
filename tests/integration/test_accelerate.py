"""accelerate used directly: ``accelerator.prepare(model, optimizer)``.

The prepared optimizer is an ``AcceleratedOptimizer``: a ``torch.optim.Optimizer`` subclass
whose ``__init__`` never calls ``Optimizer.__init__`` (so ``register_step_pre_hook`` on it
raises ``AttributeError: ... '_optimizer_step_pre_hooks'``) and whose ``step()`` is not wrapped
by torch's step hooks. Its ``.optimizer`` is the torch optimizer, whose hooks fire only when
the wrapper really steps: not on the micro-batches inside ``accelerator.accumulate`` where
``sync_gradients`` is False, and not when a GradScaler skips the step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope
from tests.integration._util import (
    assert_one_merged_row,
    assert_same_parameters,
    has_no_hooks,
    select,
)

accelerate = pytest.importorskip("accelerate")
pytest.importorskip("pandas")

BATCH = 4
FEATURES = 6
HIDDEN = 8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


def _batches(count: int):
    generator = torch.Generator().manual_seed(1)
    for _ in range(count):
        yield (
            torch.randn(BATCH, FEATURES, generator=generator),
            torch.randn(BATCH, 1, generator=generator),
        )


def _train(*, watched: bool, iterations: int, accumulate: int = 1):
    """Trains with accelerate; returns the model, the scope and its step after each iteration."""
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert isinstance(optimizer, accelerate.optimizer.AcceleratedOptimizer)
    scope = layerscope.watch(model, optimizer=optimizer, every=1) if watched else None
    seen = []
    try:
        for x, y in _batches(iterations):
            # accumulate() sets sync_gradients; with accumulate=1 every iteration steps.
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()  # a no-op inside an accumulation window
                optimizer.zero_grad()
            if scope is not None:
                seen.append(scope.current_step)
    finally:
        if scope is not None:
            scope.close()
    return model, scope, seen


def test_prepared_optimizer_steps_advance_once_per_step():
    model, scope, seen = _train(watched=True, iterations=3)
    assert seen == [1, 2, 3]
    frame = scope.frame()
    assert sorted(set(frame.step)) == [0, 1, 2]
    for step in range(3):
        for module in ("0", "2"):
            grads = select(frame, step=step, module=module, kind="weight_grad")
            assert sorted(grads.tensor) == ["bias", "weight"], (step, module)
            weights = select(frame, step=step, module=module, kind="weight")
            assert sorted(weights.tensor) == ["bias", "weight"], (step, module)
        for module in ("0", "1", "2"):
            assert_one_merged_row(
                frame, step=step, module=module, kind="activation", phase="train", passes=1
            )
    assert scope.failures == 0
    assert has_no_hooks(model)
    unwatched, _, _ = _train(watched=False, iterations=3)
    assert_same_parameters(model, unwatched)
    assert not torch.equal(model[0].weight, _model()[0].weight)  # it did train


def test_accumulation_window_is_one_step():
    # The wrapper's step() is called on every micro-batch but steps on the last of each two.
    model, scope, seen = _train(watched=True, iterations=4, accumulate=2)
    assert seen == [0, 1, 1, 2]
    frame = scope.frame()
    assert sorted(set(frame.step)) == [0, 1]
    for step in range(2):
        for module in ("0", "1", "2"):
            assert_one_merged_row(
                frame, step=step, module=module, kind="activation", phase="train", passes=2
            )
    unwatched, _, _ = _train(watched=False, iterations=4, accumulate=2)
    assert_same_parameters(model, unwatched)


def test_a_step_the_grad_scaler_skips_is_still_a_step():
    # accelerate wraps with a scaler for fp16; on the CPU build it by hand, as prepare() does.
    accelerate.Accelerator(cpu=True)
    model = _model()
    scaler = torch.amp.GradScaler("cpu")
    optimizer = accelerate.optimizer.AcceleratedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05), scaler=scaler
    )
    skipped = []
    seen = []
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for index, (x, y) in enumerate(_batches(3)):
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            if index == 1:
                model[0].weight.grad[0, 0] = float("inf")  # the scaler skips this step
            optimizer.step()
            optimizer.zero_grad()
            skipped.append(optimizer.step_was_skipped)
            seen.append(scope.current_step)
    assert skipped == [False, True, False]
    # The skipped step may end when the wrapper's step returns, or when the next one begins.
    assert seen[0] == 1
    assert seen[1] in (1, 2)
    assert seen[2] == 3
    assert scope.current_step == 3
    frame = scope.frame()
    for step in range(3):
        assert_one_merged_row(
            frame, step=step, module="0", kind="activation", phase="train", passes=1
        )


@pytest.mark.parametrize("optimizer", [object(), "a string", nn.Linear(2, 2)])
def test_an_optimizer_without_step_hooks_is_refused_by_name(tmp_path, optimizer):
    model = _model()
    run = tmp_path / "r"
    with pytest.raises(TypeError, match="optimizer"):
        layerscope.watch(model, optimizer=optimizer, every=1, run=run)
    assert not run.exists()
    assert has_no_hooks(model)
