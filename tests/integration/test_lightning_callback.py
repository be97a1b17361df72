"""``layerscope.integrations.lightning.LayerscopeCallback`` under a real ``lightning.Trainer``.

What is checked is read back from the run on disk with ``layerscope.load`` and compared with
what Lightning itself did: its global step, the losses ``training_step`` computed, the learning
rate its scheduler set, the global step at which it validated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import layerscope
from tests.integration._util import assert_same_parameters, has_no_hooks, select

L = pytest.importorskip("lightning")
pytest.importorskip("pandas")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from layerscope.integrations.lightning import LayerscopeCallback  # noqa: E402

BATCH = 4
FEATURES = 6
HIDDEN = 8
ACCUMULATE = 2
STEPS = 4
VAL_EVERY = 4  # training batches: after every 2 optimizer steps
VAL_BATCHES = 2
LR = 0.1
GAMMA = 0.5  # the scheduler halves the learning rate after every step


class Regression(L.LightningModule):
    """Keeps what Lightning did, for the tests to compare with the run."""

    def __init__(self, fail_at_batch: int | None = None, inf_at_batch: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
        self.fail_at_batch = fail_at_batch
        self.inf_at_batch = inf_at_batch
        self.losses: list[torch.Tensor] = []  # one per micro-batch
        self.validated_at: list[int] = []  # trainer.global_step when each validation began

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at_batch:
            raise RuntimeError("training_step failed on purpose")
        x, y = batch
        if batch_idx == self.inf_at_batch:
            x = x * float("inf")  # GradScaler finds Inf gradients and skips the step
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.detach())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_validation_start(self):
        self.validated_at.append(self.trainer.global_step)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def _loader(samples: int, seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    y = torch.randn(samples, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


def _fit(callbacks, logger=False, root=None, model=None, plugins=None, batches=None, **options):
    """Fit ``model`` on ``batches`` training batches; ``options`` replace the trainer's."""
    torch.manual_seed(0)
    model = model or Regression()
    chosen = {
        "max_steps": STEPS,
        "accumulate_grad_batches": ACCUMULATE,
        "val_check_interval": VAL_EVERY,
        "limit_val_batches": VAL_BATCHES,
        "num_sanity_val_steps": 1,  # before training: never recorded
    }
    trainer = L.Trainer(
        plugins=plugins,
        accelerator="cpu",
        devices=1,
        logger=logger,
        default_root_dir=root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **(chosen | options),
    )
    train = _loader((batches or STEPS * ACCUMULATE) * BATCH, seed=1)
    val = _loader((VAL_BATCHES + 1) * BATCH, seed=2)
    trainer.fit(model, train, val)
    return model, trainer


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    callback = LayerscopeCallback(every=1)
    logger = CSVLogger(tmp_path_factory.mktemp("logs"))
    model, trainer = _fit([callback], logger=logger)
    assert trainer.global_step == STEPS
    return callback, model, trainer, layerscope.load(callback.run_dir)


def test_the_run_is_in_the_loggers_directory_and_finished(fitted):
    callback, model, trainer, run = fitted
    assert callback.run_dir == os.path.join(trainer.log_dir, "layerscope")
    assert "version_0" in callback.run_dir  # the CSV logger's versioned directory
    assert run.meta["status"] == "finished"
    assert callback.failures == 0
    assert callback.scope.failures == 0
    assert has_no_hooks(model)


def test_steps_are_the_trainers_optimizer_steps(fitted):
    callback, _, trainer, run = fitted
    train = select(run.stats, phase="train")
    assert sorted(set(train.step)) == list(range(trainer.global_step))
    assert callback.scope.current_step == trainer.global_step
    # Each step merged its ACCUMULATE micro-batches.
    first = select(train, step=0, module="net.0", kind="activation")
    assert first.numel.tolist() == [ACCUMULATE * BATCH * HIDDEN]
    assert sorted(select(train, step=STEPS - 1, module="net.2", kind="weight_grad").tensor) == [
        "bias",
        "weight",
    ]


def test_validation_is_recorded_as_eval_under_the_step_it_follows(fitted):
    _, model, _, run = fitted
    # The sanity check ran at global step 0 before training; the callback starts after it.
    assert model.validated_at == [0, 2, 4]
    evaluation = select(run.stats, phase="eval")
    assert sorted(set(evaluation.step)) == [step - 1 for step in model.validated_at[1:]]
    assert set(evaluation.kind) == {"activation"}
    rows = select(evaluation, step=1, module="net.0")
    assert rows.numel.tolist() == [VAL_BATCHES * BATCH * HIDDEN]


def test_loss_is_the_mean_of_the_steps_micro_batches(fitted):
    _, model, _, run = fitted
    losses = run.scalars[run.scalars.name == "loss"].sort_values("step")
    assert losses.step.tolist() == list(range(STEPS))
    expected = [
        float(
            sum(
                loss / ACCUMULATE
                for loss in model.losses[step * ACCUMULATE : (step + 1) * ACCUMULATE]
            )
        )
        for step in range(STEPS)
    ]
    assert losses.value.tolist() == pytest.approx(expected, rel=1e-6)


def test_the_loss_of_an_epochs_short_last_window_is_the_mean_of_what_it_held():
    # Three micro-batches a step, four batches an epoch: the last window holds one, whose loss
    # Lightning still divided by three.
    callback = LayerscopeCallback(run=None, every=1)
    model, trainer = _fit(
        [callback], batches=4, max_steps=-1, max_epochs=2, accumulate_grad_batches=3,
        limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
    assert trainer.global_step == 4  # two windows an epoch: three batches, then one
    scalars = callback.scope.frame("scalars")
    losses = scalars[scalars.name == "loss"].sort_values("step").value.tolist()
    micro = [float(loss) for loss in model.losses]
    expected = [sum(micro[0:3]) / 3, micro[3], sum(micro[4:7]) / 3, micro[7]]
    assert losses == pytest.approx(expected, rel=1e-6)


def test_lr_is_the_one_the_step_used(fitted):
    _, _, _, run = fitted
    lrs = run.scalars[run.scalars.name == "lr"].sort_values("step")
    assert lrs.step.tolist() == list(range(STEPS))
    # The scheduler steps before on_train_batch_end: a late read would be one step ahead.
    assert lrs.value.tolist() == pytest.approx([LR * GAMMA**step for step in range(STEPS)])


def test_training_is_bit_identical_to_an_unwatched_fit(fitted):
    _, watched, _, _ = fitted
    unwatched, _ = _fit([])
    assert_same_parameters(watched, unwatched)
    assert not torch.equal(watched.net[0].weight, Regression().net[0].weight)  # it trained


def test_without_a_logger_runs_go_to_the_root_dir_one_per_fit(tmp_path):
    callback = LayerscopeCallback(every=2)
    _fit([callback], root=tmp_path)
    first = callback.run_dir
    model, _ = _fit([callback], root=tmp_path)  # a second fit: a run of its own
    assert first == os.path.join(tmp_path, "layerscope")
    assert callback.run_dir == os.path.join(tmp_path, "layerscope-2")
    for path in (first, callback.run_dir):
        run = layerscope.load(path)
        assert run.meta["status"] == "finished"
        train = run.stats[run.stats.phase == "train"]
        assert sorted(set(train.step)) == [0, 2]
    assert has_no_hooks(model)


def test_an_explicit_run_wins(tmp_path):
    callback = LayerscopeCallback(every=1, run=tmp_path / "mine")
    assert callback.run_dir == str(tmp_path / "mine")
    _fit([callback], root=tmp_path / "root")
    assert layerscope.load(tmp_path / "mine").meta["status"] == "finished"
    assert not (tmp_path / "root" / "layerscope").exists()

    in_memory = LayerscopeCallback(every=1, run=None)
    _fit([in_memory], root=tmp_path / "root")
    assert in_memory.run_dir is None
    assert sorted(set(in_memory.scope.frame().step)) == list(range(STEPS))


def test_an_exception_closes_the_run_as_failed(tmp_path):
    callback = LayerscopeCallback(every=1)
    model = Regression(fail_at_batch=5)  # in step 2, after steps 0 and 1
    with pytest.raises(RuntimeError, match="on purpose"):
        _fit([callback], root=tmp_path, model=model)
    run = layerscope.load(callback.run_dir)
    assert run.meta["status"] == "failed"
    assert {0, 1} <= set(run.stats.step)
    assert set(run.scalars.step) == {0, 1}
    assert has_no_hooks(model)


def test_alerts_raise_still_stops_training_and_the_run_is_failed(tmp_path):
    callback = LayerscopeCallback(every=1, alerts="raise")
    model = Regression(inf_at_batch=2)  # step 1
    with pytest.raises(layerscope.NonFiniteError, match="step 1"):
        _fit([callback], root=tmp_path, model=model)
    run = layerscope.load(callback.run_dir)
    assert run.meta["status"] == "failed"
    assert callback.failures == 0
    assert has_no_hooks(model)


def test_a_step_gradscaler_skipped_is_a_step_of_its_own():
    from lightning.pytorch.plugins import MixedPrecision

    callback = LayerscopeCallback(every=1, run=None, alerts=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)  # only the Inf makes it skip
    model = Regression(inf_at_batch=2)  # the first micro-batch of step 1
    _, trainer = _fit([callback], model=model, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    assert trainer.global_step == STEPS
    assert callback.scope.current_step == STEPS
    scalars = callback.scope.frame("scalars")
    assert scalars[scalars.name == "skipped"].step.tolist() == [1]
    assert sorted(scalars[scalars.name == "lr"].step) == list(range(STEPS))
    assert sorted(set(callback.scope.frame().step)) == list(range(STEPS))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"evry": 10}, TypeError, "unexpected keyword argument 'evry'"),
        ({"optimizer": None}, TypeError, "^optimizer: "),
        ({"model": None}, TypeError, "^model: "),
        ({"every": 0}, ValueError, "^every: "),
        ({"include": "("}, ValueError, "^include: "),
        ({"kinds": ["weights"]}, ValueError, "^kinds: "),
        ({"capture": ["weights"]}, ValueError, "^kinds: "),
        ({"run": 3}, TypeError, "^run: "),
    ],
)
def test_bad_options_fail_when_the_callback_is_made(options, error, match):
    with pytest.raises(error, match=match):
        LayerscopeCallback(**options)


def test_a_failure_to_watch_warns_and_training_goes_on(tmp_path):
    callback = LayerscopeCallback(include="^no such module$")
    with pytest.warns(layerscope.LayerscopeWarning, match="watching the model failed"):
        watched, trainer = _fit([callback], root=tmp_path)
    assert trainer.global_step == STEPS
    assert callback.scope is None
    assert callback.failures == 1
    unwatched, _ = _fit([])
    assert_same_parameters(watched, unwatched)


# Lightning's "ddp" strategy starts rank 1 by running the script again: a script of its own.
DDP_JOB = textwrap.dedent(
    """
    import sys

    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from layerscope.integrations.lightning import LayerscopeCallback
    from tests.integration.test_lightning_callback import Regression

    x, y = torch.randn(64, 6), torch.randn(64, 1)
    callback = LayerscopeCallback(every=1)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=3, limit_val_batches=1,
        val_check_interval=2, logger=CSVLogger(sys.argv[1]), enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[callback],
    )
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    trainer.fit(Regression(), loader, loader)
    print("run_dir", trainer.global_rank, callback.run_dir)
    """
)


@pytest.mark.slow
def test_under_ddp_every_rank_writes_into_the_one_run(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    script = tmp_path / "job.py"
    script.write_text(DDP_JOB)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = str(tmp_path / "logs" / "lightning_logs" / "version_0" / "layerscope")
    printed = sorted(line for line in result.stdout.splitlines() if line.startswith("run_dir"))
    assert printed == [f"run_dir 0 {path}", f"run_dir 1 {path}"]
    run = layerscope.load(path)
    assert [(rank["rank"], rank["status"]) for rank in run.meta["ranks"]] == [
        (0, "finished"),
        (1, "finished"),
    ]
    for rank in (0, 1):
        rows = select(run.stats, rank=rank)
        assert sorted(set(select(rows, phase="train").step)) == [0, 1, 2]
        assert sorted(set(select(rows, phase="eval").step)) == [1]


def test_a_fit_resumed_from_a_checkpoint_goes_on_from_its_global_step(tmp_path):
    def trainer(steps, callback):
        return L.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            default_root_dir=tmp_path,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            max_steps=steps,
            limit_val_batches=0,
            callbacks=[callback],
        )

    first = LayerscopeCallback(every=1, run=tmp_path / "first")
    before = trainer(2, first)
    before.fit(Regression(), _loader(8 * BATCH, seed=1))
    before.save_checkpoint(tmp_path / "step2.ckpt")
    second = LayerscopeCallback(every=1, run=tmp_path / "second")
    after = trainer(4, second)
    after.fit(Regression(), _loader(8 * BATCH, seed=1), ckpt_path=tmp_path / "step2.ckpt")
    assert sorted(set(layerscope.load(tmp_path / "first").stats.step)) == [0, 1]
    resumed = layerscope.load(tmp_path / "second")
    assert sorted(set(resumed.stats.step)) == [2, 3]
    assert resumed.scalars[resumed.scalars.name == "loss"].step.tolist() == [2, 3]


def test_a_rank_takes_rank_0s_run_directory_though_rank_0_has_begun_writing_it(
    tmp_path, monkeypatch
):
    import torch.distributed as dist

    from layerscope.integrations._watcher import fresh_run_dir

    (tmp_path / "layerscope").mkdir()
    (tmp_path / "layerscope" / "run.json").write_text("{}")  # rank 0's run, begun
    chosen_by_rank_0 = str(tmp_path / "layerscope")
    sent = []

    def broadcast(objects, src):
        sent.append((list(objects), src))
        objects[0] = chosen_by_rank_0

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    assert fresh_run_dir(str(tmp_path)) == chosen_by_rank_0
    assert sent == [([None], 0)]  # rank 1 looked at nothing itself
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    assert fresh_run_dir(str(tmp_path)) == chosen_by_rank_0  # what rank 0 sent
    assert sent[1] == ([str(tmp_path / "layerscope-2")], 0)


def test_validation_in_the_middle_of_a_window_is_recorded_under_the_step_in_progress():
    # Two micro-batches a step, validation after every 3rd batch: after batch 3, half-way
    # through step 1's window, and after batch 6, at step 2's end.
    callback = LayerscopeCallback(run=None, every=1)
    model, trainer = _fit([callback], batches=6, max_steps=3, val_check_interval=3)
    assert trainer.global_step == 3
    assert model.validated_at[1:] == [1, 3]  # the optimizer steps done when each began
    frame = callback.scope.frame()
    assert sorted(set(frame[frame.phase == "eval"].step)) == [1, 2]
