"""Steps on real training loops: a Lightning GAN under manual optimization, accelerate's loop.

A step is one training iteration: one Lightning batch that stepped, whatever the number and
the order of its optimizers' steps; one optimizer step of accelerate's ``accumulate()``
window, not each micro-batch that the window held back. Each test compares the run with what
the library itself did: the weights after each batch, the batches it validated after, the
losses of the micro-batches.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import layerscope
from tests.integration._util import assert_one_merged_row, assert_same_parameters, select

L = pytest.importorskip("lightning")
accelerate = pytest.importorskip("accelerate")
pytest.importorskip("pandas")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from layerscope.integrations.lightning import LayerscopeCallback  # noqa: E402

BATCH = 4
NOISE = 2
SAMPLE = 3
BATCHES = 16
VAL_EVERY = 4  # batches


class GAN(L.LightningModule):
    """Each batch steps the generator, then the critic; keeps the weights after each batch."""

    def __init__(self, critic_listed_first: bool = False, critic_steps: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.critic_listed_first = critic_listed_first
        self.critic_steps = critic_steps
        self.steps_per_batch = 1 + critic_steps  # what Lightning's global step counts
        self.generator = nn.Sequential(nn.Linear(NOISE, 8), nn.ReLU(), nn.Linear(8, SAMPLE))
        self.critic = nn.Sequential(nn.Linear(SAMPLE, 8), nn.ReLU(), nn.Linear(8, 1))
        self.weights_after: list[dict[str, torch.Tensor]] = []  # one per training batch
        self.validated_after: list[int] = []  # training batches done at each validation

    def training_step(self, batch, batch_idx):
        (real,) = batch
        optimizers = self.optimizers()
        gen_opt, critic_opt = optimizers[::-1] if self.critic_listed_first else optimizers
        fake = self.generator(torch.randn(real.shape[0], NOISE))
        gen_opt.zero_grad()
        self.manual_backward(-self.critic(fake).mean())
        gen_opt.step()
        for _ in range(self.critic_steps):
            critic_loss = self.critic(fake.detach()).mean() - self.critic(real).mean()
            critic_opt.zero_grad()
            self.manual_backward(critic_loss)
            critic_opt.step()
        return critic_loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.weights_after.append(
            {
                "generator.0": self.generator[0].weight.detach().clone(),
                "critic.0": self.critic[0].weight.detach().clone(),
            }
        )

    def validation_step(self, batch, batch_idx):
        (real,) = batch
        return self.critic(real).mean()

    def on_validation_start(self):
        self.validated_after.append(len(self.weights_after))

    def configure_optimizers(self):
        gen_opt = torch.optim.SGD(self.generator.parameters(), lr=0.05)
        critic_opt = torch.optim.SGD(self.critic.parameters(), lr=0.05)
        return [critic_opt, gen_opt] if self.critic_listed_first else [gen_opt, critic_opt]


def _samples(batches: int, seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(batches * BATCH, SAMPLE, generator=generator)
    return DataLoader(TensorDataset(data), batch_size=BATCH)


def _fit(module, callbacks, batches, root, ckpt_path=None, val=True):
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        default_root_dir=root,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=module.steps_per_batch * batches,  # it counts every optimizer's steps
        val_check_interval=VAL_EVERY,
        limit_val_batches=1 if val else 0,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(module, _samples(BATCHES, seed=1), _samples(1, seed=2), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize(("critic_listed_first", "critic_steps"), [(False, 1), (True, 2)])
def test_a_gan_under_manual_optimization_takes_one_step_per_batch(
    tmp_path, critic_listed_first, critic_steps
):
    module = GAN(critic_listed_first, critic_steps)
    callback = LayerscopeCallback(
        every=1, run=None, kinds=("activation", "weight", "weight_grad", "update")
    )
    trainer = _fit(module, [callback], BATCHES, tmp_path)
    assert trainer.global_step == module.steps_per_batch * BATCHES
    assert callback.scope.current_step == BATCHES
    frame = callback.scope.frame()
    train = select(frame, phase="train")
    assert sorted(set(train.step)) == list(range(BATCHES))
    for step in range(BATCHES):
        for module_name in ("generator.0", "critic.0"):
            # Both optimizers' readings are in the batch's step, with the weights it left.
            for kind in ("weight_grad", "update"):
                rows = select(train, step=step, module=module_name, kind=kind, tensor="weight")
                assert len(rows) == 1, (step, module_name, kind)
            weight = select(train, step=step, module=module_name, kind="weight", tensor="weight")
            after = module.weights_after[step][module_name].double()
            assert weight["mean"].item() == pytest.approx(after.mean().item(), rel=1e-6)
            assert weight["max"].item() == pytest.approx(after.max().item(), rel=1e-6)
    # Validation after batches 4, 8... follows steps 3, 7...: the batches' last.
    assert module.validated_after == [4, 8, 12, 16]
    evaluated = select(frame, phase="eval")
    assert sorted(set(evaluated.step)) == [done - 1 for done in module.validated_after]
    losses = callback.scope.frame("scalars").query("name == 'loss'")
    assert losses.step.tolist() == list(range(BATCHES))
    assert callback.scope.frame("scalars").query("name == 'skipped'").empty


def test_a_resumed_gan_goes_on_from_the_step_after_the_last(tmp_path):
    first = LayerscopeCallback(every=1, run=tmp_path / "first", kinds=("weight",))
    # Saved at the end of a batch, as Lightning counts it (batch 5 of 16)...
    middle = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=10, save_top_k=-1)
    before = _fit(GAN(), [first, middle], BATCHES, tmp_path, val=False)
    before.save_checkpoint(tmp_path / "end.ckpt")  # ...and after the fit (batch 16)
    assert sorted(set(layerscope.load(tmp_path / "first").stats.step)) == list(range(BATCHES))
    checkpoints = {"epoch=0-step=10.ckpt": 5, "end.ckpt": BATCHES}
    for name, batches_done in checkpoints.items():
        run = tmp_path / f"resumed-{batches_done}"
        callback = LayerscopeCallback(every=1, run=run, kinds=("weight",))
        resumed = _fit(
            GAN(), [callback], batches_done + 4, tmp_path, ckpt_path=tmp_path / name, val=False
        )
        assert resumed.global_step == 2 * (batches_done + 4)
        expected = list(range(batches_done, batches_done + 4))
        assert sorted(set(layerscope.load(run).stats.step)) == expected, name
        scalars = layerscope.load(run).scalars
        assert scalars[scalars.name == "loss"].step.tolist() == expected, name


# ---------------------------------------------------------------- accelerate

FEATURES = 6
ITERATIONS = 8
ACCUMULATE = 2


def _regression() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, 1))


def _batches(count: int):
    generator = torch.Generator().manual_seed(1)
    for _ in range(count):
        x = torch.randn(BATCH, FEATURES, generator=generator)
        yield x, torch.randn(BATCH, 1, generator=generator)


def _accelerate_loop(*, watched: bool, scaler=None, inf_at=None):
    """accelerate's usual loop; ``scope.step(loss=...)`` every iteration, as its examples log.

    Returns the model, the scope, the micro-batches' losses and whether each step was skipped.
    """
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if scaler is None:
        model, optimizer = accelerator.prepare(model, optimizer)
    else:  # accelerate wraps with a scaler for fp16 only: on the CPU, wrap by hand
        optimizer = accelerate.optimizer.AcceleratedOptimizer(optimizer, scaler=scaler)
    scope = layerscope.watch(model, optimizer=optimizer, every=1) if watched else None
    losses, skipped = [], []
    try:
        for index, (x, y) in enumerate(_batches(ITERATIONS)):
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss if scaler is None else scaler.scale(loss))
                if index == inf_at:
                    model[0].weight.grad[0, 0] = float("inf")
                optimizer.step()  # does nothing on a micro-batch that accumulate() holds back
                optimizer.zero_grad()
                if accelerator.sync_gradients:
                    skipped.append(optimizer.step_was_skipped)
            losses.append(loss.detach())
            if scope is not None:
                scope.step(loss=loss)
    finally:
        if scope is not None:
            scope.close()
    return model, scope, losses, skipped


def test_accelerates_micro_batches_are_part_of_their_step_not_skipped_steps():
    model, scope, losses, _ = _accelerate_loop(watched=True)
    steps = ITERATIONS // ACCUMULATE
    assert scope.current_step == steps
    scalars = scope.frame("scalars")
    assert scalars.query("name == 'skipped'").empty
    loss = scalars.query("name == 'loss'")
    assert loss.step.tolist() == list(range(steps))
    # The mean of the window's micro-batches, as accelerate's and Lightning's loops log it.
    expected = [float(sum(losses[2 * step : 2 * step + 2]) / 2) for step in range(steps)]
    assert loss.value.tolist() == pytest.approx(expected, rel=1e-6)
    frame = scope.frame()
    for step in range(steps):
        assert_one_merged_row(
            frame, step=step, module="0", kind="activation", phase="train", passes=ACCUMULATE
        )
        assert sorted(select(frame, step=step, module="0", kind="weight_grad").tensor) == [
            "bias",
            "weight",
        ]
    unwatched, _, _, _ = _accelerate_loop(watched=False)
    assert_same_parameters(model, unwatched)


def test_a_window_whose_step_grad_scaler_skipped_is_one_skipped_step():
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)  # only the Inf makes it skip
    _, scope, _, skipped = _accelerate_loop(watched=True, scaler=scaler, inf_at=3)
    assert skipped == [False, True, False, False]  # the second window's step
    assert scope.current_step == ITERATIONS // ACCUMULATE
    scalars = scope.frame("scalars")
    assert scalars.query("name == 'skipped'").step.tolist() == [1]
    assert scalars.query("name == 'loss'").step.tolist() == [0, 1, 2, 3]
    activations = select(scope.frame(), module="0", kind="activation")
    assert activations.numel.tolist() == [ACCUMULATE * BATCH * 8] * 4


def test_scalars_of_a_window_the_training_left_unfinished_are_kept_at_close():
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = _regression()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    batches = list(_batches(4))
    losses = []

    def iteration(x, y):
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.detach())
        return loss

    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for x, y in batches[:3]:  # a window and a half
            scope.step(loss=iteration(x, y), tokens=torch.tensor(BATCH))
    iteration(*batches[3])  # the window's end, unwatched: accelerate syncs again
    scalars = scope.frame("scalars")
    assert scalars.query("name == 'skipped'").empty
    assert scalars.query("name == 'loss'").value.tolist() == pytest.approx(
        [float(losses[0] + losses[1]) / 2, float(losses[2])], rel=1e-6
    )
    # The unfinished step keeps what it had: its scalars, its micro-batch's activations.
    assert scalars.query("name == 'tokens'").step.tolist() == [0, 1]
    assert scalars.query("name == 'tokens'").value.tolist() == [BATCH, BATCH]
    assert_one_merged_row(
        scope.frame(), step=1, module="0", kind="activation", phase="train", passes=1
    )


def test_a_loop_that_steps_only_when_accelerate_syncs_takes_one_step_per_window():
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # not prepared: no wrapper
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for x, y in _batches(ITERATIONS):
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    optimizer.step()
                    optimizer.zero_grad()
            scope.step(loss=loss)
    assert scope.current_step == ITERATIONS // ACCUMULATE
    scalars = scope.frame("scalars")
    assert scalars.query("name == 'skipped'").empty
    assert scalars.query("name == 'loss'").step.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (torch.ones(2), ValueError, "scalar 'loss' must have one element"),
        ("high", TypeError, "scalar 'loss' must be a number or a one-element tensor"),
    ],
)
def test_a_bad_scalar_on_a_held_back_micro_batch_is_refused_at_once(value, error, match):
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = _regression()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    x, y = next(_batches(1))
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for _ in range(ACCUMULATE):  # the whole window, so that accelerate syncs again
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
            if not accelerator.sync_gradients:
                with pytest.raises(error, match=match):
                    scope.step(loss=value)
            scope.step(loss=1.0)
    assert scope.frame("scalars").value.tolist() == [1.0]
