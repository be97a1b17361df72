"""``LayerscopeCallback`` for the Hugging Face ``Trainer``: watch a model while it trains.

Steps follow the optimizer's: the callback watches the model with the optimizer the Trainer
prepared (accelerate's wrapper, looked through), so the micro-batches of
``gradient_accumulation_steps`` merge into the step their optimizer step ends, and a step
GradScaler skipped is a step of its own, marked ``skipped``. Evaluation runs in eval mode
without gradients: it is recorded with ``phase="eval"``, under the step it follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from layerscope.integrations._watcher import Watcher
from layerscope.scope import Scope

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as error:  # pragma: no cover - the transformers extra is in dev
    raise ImportError(
        "layerscope.integrations.transformers needs transformers; install it with: "
        "pip install 'layerscope[transformers]'"
    ) from error

#: Log entries that are bookkeeping, not measurements of training: not recorded.
_BOOKKEEPING = frozenset({"epoch", "total_flos", "num_input_tokens_seen"})
_TIMING = ("_runtime", "_per_second", "_preparation_time")


class LayerscopeCallback(TrainerCallback):
    """Record a model's layers while ``Trainer.train()`` trains it.

    When training begins it watches the Trainer's model with the Trainer's optimizer. What the
    Trainer logs is recorded as scalars, when it logs it: ``loss`` (the mean over the steps
    since the last log), ``learning_rate`` and ``grad_norm`` every ``logging_steps`` steps,
    ``eval_loss`` and other metrics after an evaluation (timings, ``epoch`` and
    ``total_flos`` left out). The Trainer's step ``G`` (``state.global_step``, counted from 1)
    is layerscope's step ``G - 1`` (counted from 0, as the statistics' ``step``), so a loss
    logged at ``G`` lies with the statistics of the step that ended it. The run is closed
    when training ends.

    The Trainer calls no callback when training raises: train inside ``with callback:`` to
    close the run as ``"failed"`` then (its hooks go, what it recorded stays). Otherwise the
    next ``train()`` closes it so, as does the interpreter's exit.

    The run goes to ``<args.output_dir>/layerscope``, or ``layerscope-2``, ``-3``... when a
    run is there already. ``run=`` chooses the directory; ``run=None`` keeps the run in memory
    (``callback.scope.frame()``). Steps go on from the Trainer's global step: training
    resumed from a checkpoint at global step G records its first step as G (``start_step=``
    sets another).

    Monitoring never stops training: if something in layerscope fails in a hook, that warns
    once (``layerscope.LayerscopeWarning``) and is counted in ``failures``. Only
    ``watch(alerts="raise")`` stops training, as asked.

    Args:
        **watch_options: ``layerscope.watch()``'s options but ``model`` and ``optimizer``,
            which come from the Trainer: ``run``, ``every``, ``kinds``, ``include``...
            ``capture``, the old name of ``kinds``, is taken as it with a FutureWarning.

    Raises:
        TypeError, ValueError: the errors ``watch()`` gives for the same options, raised here
            so that a typo fails before training starts.

    Examples:
        >>> from layerscope.integrations.transformers import LayerscopeCallback
        >>> callback = LayerscopeCallback(every=10, exclude="drop")
        >>> # trainer = Trainer(model, args, callbacks=[callback])
        >>> # with callback:
        >>> #     trainer.train()
        >>> LayerscopeCallback(every=0)
        Traceback (most recent call last):
        ...
        ValueError: every: expected an int >= 1 or a Schedule, got 0
    """

    def __init__(self, **watch_options: Any) -> None:
        self._watcher = Watcher(watch_options)

    @property
    def scope(self) -> Scope | None:
        """The scope of the last ``train()``, open while it trains; None before it."""
        return self._watcher.scope

    @property
    def run_dir(self) -> str | None:
        """Where the run is written: ``run=``, or the directory chosen when training began."""
        return self._watcher.run_dir

    @property
    def failures(self) -> int:
        """How many times the callback's own work failed and was skipped."""
        return self._watcher.failures

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Watch the model with the optimizer the Trainer prepared."""
        optimizer = kwargs.get("optimizer")
        self._watcher.start(
            kwargs.get("model"),
            [] if optimizer is None else [optimizer],
            lambda: args.output_dir,
            state.global_step,
        )

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """End the step if GradScaler skipped its optimizer step (else it has ended)."""
        self._watcher.step()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record what the Trainer logs for the step that just ended."""
        scalars = _measurements(logs or {})
        if scalars:
            self._watcher.step(**scalars)

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Close the run as finished."""
        self._watcher.close("finished")

    def __enter__(self) -> LayerscopeCallback:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._watcher.close("failed" if exc_type is not None else "finished")


def _measurements(logs: Mapping[str, Any]) -> dict[str, float]:
    """The numbers in a log entry that measure training: losses, rates, norms, metrics."""
    return {
        name: float(value)
        for name, value in logs.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and name not in _BOOKKEEPING
        and not name.endswith(_TIMING)
    }
