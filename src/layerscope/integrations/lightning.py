"""``LayerscopeCallback`` for Lightning's ``Trainer``: watch a LightningModule while it fits.

A step is a training batch that stepped: one whose optimizer steps Lightning counted in its
global step. The callback passes the trainer's optimizers to ``watch()``, which reads each
around its own steps, and ends the step itself when the batch ends, so that the order and the
number of the optimizers' steps (a GAN's two, under manual optimization) do not matter. The
micro-batches of ``accumulate_grad_batches`` merge into the step that follows them, and a
batch whose steps AMP's GradScaler skipped is a step of its own, marked ``skipped``.
Validation runs in eval mode without gradients, so it is recorded with ``phase="eval"``, under
the step it follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from layerscope.integrations._watcher import Watcher
from layerscope.scope import Scope

try:
    import lightning.pytorch as pl
except ImportError as error:  # pragma: no cover - the lightning extra is in dev
    raise ImportError(
        "layerscope.integrations.lightning needs Lightning; install it with: "
        "pip install 'layerscope[lightning]'"
    ) from error


class LayerscopeCallback(pl.Callback):
    """Record a LightningModule's layers while ``trainer.fit()`` trains it.

    At the first training batch (after the sanity check, whose batches are not recorded) it
    watches the LightningModule with the trainer's optimizers. Each training batch in which
    an optimizer stepped ends a step, whatever the number and the order of the optimizers'
    steps (one in which AMP skipped every step is a step marked ``skipped``); batches
    without an optimizer step (micro-batches of
    ``accumulate_grad_batches``) merge into the next step. At each step's end it records two
    scalars for it: ``loss``, the loss Lightning backpropagated (with
    ``accumulate_grad_batches``, the mean of the micro-batches' losses, also of an epoch's
    last window that holds fewer of them; under manual
    optimization, the mean of what ``training_step`` returned), and ``lr``, the first
    optimizer's first parameter group's learning rate, read just before its step. The run
    is closed when ``fit`` ends, as ``"failed"`` when it raises.

    The run goes to ``<trainer.log_dir>/layerscope`` (the logger's versioned directory for the
    CSV and TensorBoard loggers, ``default_root_dir`` without a logger), or
    ``layerscope-2``, ``-3``... when a run is there already. ``run=`` chooses the directory;
    ``run=None`` keeps the run in memory (``callback.scope.frame()``). A fit resumed from a
    checkpoint goes on from the step after the checkpoint's last: from the trainer's global
    step G under automatic optimization (one optimizer step a step), and under manual
    optimization from the number of training batches Lightning restored (its global step
    counts every optimizer's steps). ``start_step=`` sets another first step.

    Monitoring never stops training: if something in layerscope fails in a hook, that warns
    once (``layerscope.LayerscopeWarning``) and is counted in ``failures``. Only
    ``watch(alerts="raise")`` stops training, as asked.

    Args:
        **watch_options: ``layerscope.watch()``'s options but ``model`` and ``optimizer``,
            which come from the trainer: ``run``, ``every``, ``kinds``, ``include``...
            ``capture``, the old name of ``kinds``, is taken as it with a FutureWarning.

    Raises:
        TypeError, ValueError: the errors ``watch()`` gives for the same options, raised here
            so that a typo fails before training starts.

    Examples:
        >>> from layerscope.integrations.lightning import LayerscopeCallback
        >>> callback = LayerscopeCallback(every=10, kinds=["activation", "update"])
        >>> # trainer = lightning.Trainer(callbacks=[callback]); trainer.fit(module)
        >>> LayerscopeCallback(every=0)
        Traceback (most recent call last):
        ...
        ValueError: every: expected an int >= 1 or a Schedule, got 0
    """

    def __init__(self, **watch_options: Any) -> None:
        super().__init__()
        self._watcher = Watcher(watch_options)
        self._waiting = False  # training started; the watch begins at its first batch
        self._global_step = 0
        self._loss: Tensor | None = None  # the sum of this step's micro-batch losses
        self._batches = 0
        self._lr: float | Tensor | None = None  # read just before the optimizer step

    @property
    def scope(self) -> Scope | None:
        """The scope of the last ``fit``, open while it trains; None before it."""
        return self._watcher.scope

    @property
    def run_dir(self) -> str | None:
        """Where the run is written: ``run=``, or the directory chosen when training started."""
        return self._watcher.run_dir

    @property
    def failures(self) -> int:
        """How many times the callback's own work failed and was skipped."""
        return self._watcher.failures

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Get ready to watch: at the first batch, once Lightning has restored its loops."""
        self._watcher.close("failed")  # left open by a fit that raised where no hook saw it
        self._waiting = True

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Watch the module with the trainer's optimizers, at the first training batch."""
        if not self._waiting:
            return
        self._waiting = False
        self._global_step = trainer.global_step
        self._loss, self._batches, self._lr = None, 0, None
        self._watcher.start(
            pl_module,
            trainer.optimizers,
            lambda: _log_dir(trainer),
            _steps_done(trainer, pl_module),
            batches_end_steps=True,
        )

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Read the learning rate of the step: schedulers change it before the batch ends."""
        if self.scope is None or optimizer is not next(iter(trainer.optimizers), None):
            return
        with self._watcher.guard("reading the learning rate"):
            self._lr = _learning_rate(optimizer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Add the batch's loss; after an optimizer step, record the step's scalars."""
        if self.scope is None:
            return
        scalars: dict[str, float | Tensor] | None = None
        with self._watcher.guard("recording the loss"):
            scalars = self._scalars_after(trainer, pl_module, outputs)
        if scalars is not None:
            self._watcher.step(**scalars)

    def _scalars_after(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any
    ) -> dict[str, float | Tensor] | None:
        """The step's scalars if an optimizer step just ended it, else None."""
        loss = _loss_of(outputs)
        if loss is not None:
            self._loss = loss.clone() if self._loss is None else self._loss + loss
            self._batches += 1
        optimizers = trainer.optimizers
        if optimizers and trainer.global_step == self._global_step:
            return None  # no optimizer stepped: a micro-batch, part of the next step
        self._global_step = trainer.global_step
        scalars: dict[str, float | Tensor] = {}
        if self._loss is not None:
            # Automatic optimization divided each micro-batch's loss by accumulate_grad_batches,
            # also in an epoch's last window that holds fewer: the mean is over those it held.
            divided = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
            scalars["loss"] = self._loss * (divided / self._batches)
        if self._lr is not None:
            scalars["lr"] = self._lr
        self._loss, self._batches, self._lr = None, 0, None
        return scalars

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close the run as finished."""
        self._watcher.close("finished")

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Close the run as failed: its hooks go, what it recorded stays."""
        self._watcher.close("failed")


def _steps_done(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    """The steps of the fit before this one: batches that stepped, as Lightning restored them.

    Under manual optimization the global step counts every optimizer's steps (two a batch for
    a GAN); the batch count is the steps, read once the loops are restored: at training start
    a checkpoint saved at a batch's end still counts that batch as unfinished.
    """
    if pl_module.automatic_optimization:
        return trainer.global_step
    return int(trainer.fit_loop.epoch_loop.batch_progress.total.completed)


def _log_dir(trainer: pl.Trainer) -> str | None:
    # trainer.log_dir is a collective under DDP: every rank calls it here, at its first batch.
    return trainer.log_dir or trainer.default_root_dir


def _loss_of(outputs: Any) -> Tensor | None:
    """The loss in ``training_step``'s outputs: a tensor, or a mapping's ``"loss"``."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss.detach()
    return None


def _learning_rate(optimizer: Any) -> float | Tensor | None:
    lr = optimizer.param_groups[0].get("lr")
    if isinstance(lr, Tensor):  # a capturable optimizer's: copied, a scheduler changes it
        return lr.detach().clone()
    return float(lr) if isinstance(lr, int | float) else None
