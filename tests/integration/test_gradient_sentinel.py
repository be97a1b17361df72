"""The gradients' sentinel on real loops: Lightning's closure, the HF Trainer, GradScaler.

Between recorded steps it reads each watched parameter's gradient where the weight gradients
are read: after Lightning's closure computed them, after the Trainer's accumulation, and not
at all in a step whose optimizer step GradScaler skipped. Each test compares its rows with the
gradients the optimizer stepped with, taken by a step hook of the test's own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import layerscope
from layerscope import Schedule

pytest.importorskip("pandas")

EVERY = 3  # steps 0 and 3 are recorded; the sentinel watches the others


class Gradients:
    """Float64 gradients of each parameter when the optimizer stepped, by step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.values: dict[tuple[int, str], np.ndarray] = {}
        self.steps = 0
        self._names = {id(p): name for name, p in model.named_parameters()}
        # After the step: a closure (Lightning) computes the gradients inside it.
        optimizer.register_step_post_hook(self._keep)

    def _keep(self, optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    grad = param.grad.detach().double().numpy().ravel()
                    self.values[(self.steps, self._names[id(param)])] = grad
        self.steps += 1


def check_sentinel(frame, gradients: Gradients, steps: list[int]) -> None:
    """The sentinel's rows are the weight gradients of exactly ``steps``, value for value."""
    sentinel = frame[frame.sentinel]
    assert set(sentinel.kind) == {"weight_grad"}
    assert sorted(set(sentinel.step)) == steps
    for row in sentinel.itertuples():
        name = f"{row.module}.{row.tensor}" if row.module else row.tensor
        values = gradients.values[(row.step, name)]
        assert (row.min, row.max, row.numel) == (values.min(), values.max(), values.size), name
    per_step = sentinel.groupby("step").size()
    assert (per_step == per_step.iloc[0]).all()  # every parameter, every step


def test_lightning_automatic_optimization_reads_the_closures_gradients():
    lightning = pytest.importorskip("lightning")
    from layerscope.integrations.lightning import LayerscopeCallback
    from tests.integration.test_lightning import ACCUMULATE, Regression, _loader

    steps = 5

    class Capture(lightning.Callback):
        def on_train_start(self, trainer, pl_module):
            self.gradients = Gradients(pl_module, trainer.optimizers[0])

    torch.manual_seed(0)
    capture = Capture()
    callback = LayerscopeCallback(every=Schedule(every=EVERY, sentinel="gradients"), run=None)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=steps,
        accumulate_grad_batches=ACCUMULATE,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[capture, callback],
    )
    trainer.fit(Regression(), _loader(steps * ACCUMULATE * 4, seed=1))
    check_sentinel(callback.scope.frame(), capture.gradients, [1, 2, 4])


def test_the_trainer_reads_the_accumulated_gradients_once_per_step(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from layerscope.integrations.transformers import LayerscopeCallback
    from tests.integration.test_transformers_callback import MAX_STEPS, _trainer

    class Capture(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
            self.gradients = Gradients(model, inner)

    capture = Capture()
    callback = LayerscopeCallback(every=Schedule(every=EVERY, sentinel="gradients"), run=None)
    trainer = _trainer(tmp_path, [callback, capture], accumulate=2)
    trainer.train()
    unrecorded = [step for step in range(MAX_STEPS) if step % EVERY]
    check_sentinel(callback.scope.frame(), capture.gradients, unrecorded)


def test_a_step_grad_scaler_skipped_is_not_read_and_raises_no_alert():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gradients = Gradients(model, optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)  # only the Inf makes it skip
    schedule = Schedule(every=EVERY, sentinel="gradients")
    with layerscope.watch(model, optimizer=optimizer, every=schedule) as scope:
        for step in range(6):
            loss = model(torch.randn(4, 6)).pow(2).mean()
            scaler.scale(loss).backward()
            if step == 4:
                model[0].weight.grad[0, 0] = math.inf
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scope.step(loss=loss)
    frame = scope.frame()
    # Step 4's optimizer step never ran: the stepped gradients are those of steps 0-3 and 5.
    gradients.values = {
        (step + (step >= 4), name): v for (step, name), v in gradients.values.items()
    }
    check_sentinel(frame, gradients, [1, 2, 5])
    assert scope.frame("scalars").query("name == 'skipped'").step.tolist() == [4]
    assert scope.frame("alerts").query("rule == 'nonfinite'").empty
