"""Lightning: steps follow the optimizer, micro-batches and evaluation batches merge per step.

``training_step`` and ``validation_step`` call ``self.net``: the LightningModule's own forward
never runs, so the root's forward hook never fires. Automatic optimization calls
``optimizer.step(closure=...)`` on the raw optimizer only on the last micro-batch of each
accumulation window; the closure runs that micro-batch's forward and backward.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import layerscope
from tests.integration._util import assert_one_merged_row, has_no_hooks, select

L = pytest.importorskip("lightning")
pytest.importorskip("pandas")

BATCH = 4
FEATURES = 6
HIDDEN = 8
ACCUMULATE = 2
STEPS = 3
VAL_BATCHES = 3
# module name -> features of its output
OUTPUTS = {"net.0": HIDDEN, "net.1": HIDDEN, "net.2": 1}


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Watch(L.Callback):
    """Attaches layerscope at the start of training and closes it at the end."""

    def __init__(self, which_optimizer: str) -> None:
        self.which_optimizer = which_optimizer
        self.scope = None
        self.step_at_end = None

    def on_train_start(self, trainer, pl_module):
        if self.which_optimizer == "trainer.optimizers[0]":
            optimizer = trainer.optimizers[0]  # the torch optimizer itself
        else:
            optimizer = pl_module.optimizers()  # a LightningOptimizer wrapping it
        self.scope = layerscope.watch(pl_module, optimizer=optimizer, every=1)

    def on_train_end(self, trainer, pl_module):
        self.step_at_end = self.scope.current_step
        self.scope.close()


def _loader(samples: int, seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    y = torch.randn(samples, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


def _fit(callbacks) -> Regression:
    torch.manual_seed(0)
    model = Regression()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=STEPS,
        accumulate_grad_batches=ACCUMULATE,
        limit_val_batches=VAL_BATCHES,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=1,  # one epoch of STEPS * ACCUMULATE batches: once, at its end
        callbacks=callbacks,
    )
    train = _loader(STEPS * ACCUMULATE * BATCH, seed=1)
    val = _loader((VAL_BATCHES + 1) * BATCH, seed=2)  # one batch more than limit_val_batches
    trainer.fit(model, train, val)
    assert trainer.global_step == STEPS
    return model


@pytest.fixture(scope="module", params=["trainer.optimizers[0]", "pl_module.optimizers()"])
def fitted(request):
    watch = Watch(request.param)
    model = _fit([watch])
    return watch, model


def test_steps_follow_the_optimizer_steps(fitted):
    watch, _ = fitted
    frame = watch.scope.frame()
    assert watch.step_at_end == STEPS
    for step in range(STEPS):
        for module in ("net.0", "net.2"):
            grads = select(frame, step=step, module=module, kind="weight_grad")
            assert sorted(grads.tensor) == ["bias", "weight"], (step, module)
    # Validation after the last step belongs to that step: nothing is recorded after it.
    assert sorted(set(frame.step)) == list(range(STEPS))
    assert watch.scope.failures == 0


def test_micro_batches_merge_into_one_row_per_step(fitted):
    watch, _ = fitted
    frame = watch.scope.frame()
    for step in range(STEPS):
        for module, features in OUTPUTS.items():
            for kind in ("activation", "grad"):
                assert_one_merged_row(
                    frame, step=step, module=module, kind=kind, phase="train", passes=ACCUMULATE
                )
            row = select(frame, step=step, module=module, kind="activation", phase="train")
            assert row.numel.item() == ACCUMULATE * BATCH * features


def test_validation_merges_under_the_last_training_step(fitted):
    watch, _ = fitted
    frame = watch.scope.frame()
    evaluation = select(frame, phase="eval")
    assert set(evaluation.kind) == {"activation"}  # no gradients, no parameter reads
    assert set(evaluation.step) == {STEPS - 1}
    for module, features in OUTPUTS.items():
        assert_one_merged_row(
            frame,
            step=STEPS - 1,
            module=module,
            kind="activation",
            phase="eval",
            passes=VAL_BATCHES,
        )
        row = select(frame, module=module, kind="activation", phase="eval")
        assert row.numel.item() == VAL_BATCHES * BATCH * features


def test_call_order_is_one_forward(fitted):
    watch, _ = fitted
    calls = watch.scope.frame("calls")
    expected = []
    for module in OUTPUTS:
        expected += [("enter", module, 0), ("exit", module, 0)]
    assert not calls.empty
    for _, step in calls.groupby("step"):  # every recorded step's order: one forward pass
        assert list(zip(step.event, step.module, step.call, strict=True)) == expected
        assert list(step.seq) == list(range(len(expected)))


@pytest.fixture(scope="module")
def unwatched():
    return _fit([])


def test_training_is_unchanged_and_no_hook_is_left(fitted, unwatched):
    _, watched = fitted
    for (name, a), (_, b) in zip(
        watched.named_parameters(), unwatched.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert has_no_hooks(watched)
