"""What the trainer callbacks share: options checked early, the run's directory, guarded hooks.

A callback is made long before training starts, so its options are checked when it is made,
with the errors ``watch()`` would give then; what can only fail once the model is known (a
selection that matches no module) warns at the start of training, which goes on unwatched.
The run goes to a fresh directory in the trainer's logs unless ``run=`` says where.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch import Tensor

from layerscope._config import WatchConfig
from layerscope._errors import LayerscopeWarning, NonFiniteError
from layerscope._imports import require
from layerscope._watch import check_sinks, options_with_kinds, watch
from layerscope.scope import Scope
from layerscope.store import ParquetStore

#: ``watch()`` arguments the callback fills in from the trainer, with what it passes.
_SUPPLIED = {"model": "the model the trainer trains", "optimizer": "the trainer's optimizer"}
#: The run's directory inside the trainer's log directory.
RUN_NAME = "layerscope"


def check_options(options: Mapping[str, Any]) -> None:
    """Raise the error ``watch()`` would raise for ``options``, before any training.

    Raises:
        TypeError: an option ``watch()`` does not take (or one the callback passes itself),
            or an option of the wrong type.
        ValueError: an option ``watch()`` would refuse, such as a bad regex.
        ImportError: the run goes to a directory and ``layerscope[dataframe]`` is missing.
    """
    for name, what in _SUPPLIED.items():
        if name in options:
            raise TypeError(f"{name}: LayerscopeCallback passes {what} to watch(); leave it out")
    signature = inspect.signature(watch)
    try:
        signature.bind_partial(**options)
    except TypeError as error:
        names = ", ".join(name for name in signature.parameters if name not in _SUPPLIED)
        raise TypeError(
            f"LayerscopeCallback {error}; it takes watch()'s options: {names}"
        ) from None
    defaults = {name: parameter.default for name, parameter in signature.parameters.items()}
    values = {**defaults, **options}
    # The checks watch() makes, on every option its config takes.
    checked = inspect.signature(WatchConfig.from_arguments).parameters
    WatchConfig.from_arguments(
        has_optimizer=True, **{name: values[name] for name in checked if name in values}
    )
    check_sinks(values["sinks"])
    run = options.get("run")
    if run is not None and not isinstance(run, ParquetStore):
        ParquetStore(run)  # the checks of a path watch() makes; touches no file
    if "run" not in options or run is not None:  # the run is written to files
        require("pyarrow", "dataframe")
        require("fsspec", "dataframe")


def fresh_run_dir(parent: str) -> str:
    """``<parent>/layerscope``, or ``layerscope-2``, ``-3``... where a run is there already.

    A second ``fit()`` into the same log directory then writes a run of its own instead of
    failing on the first one's. Under torch.distributed rank 0 chooses and every rank takes
    its choice: a rank that looked for itself could see the run rank 0 has just begun.
    """
    from layerscope.distributed import rank_zero_choice
    from layerscope.store import first_free_run

    return rank_zero_choice(lambda: first_free_run(f"{parent.rstrip('/')}/{RUN_NAME}"))


def run_path(run: object) -> str | None:
    """The directory a ``run=`` value writes to; None for a run kept in memory."""
    if run is None:
        return None
    if isinstance(run, ParquetStore):
        return run.path
    return os.fspath(run) if isinstance(run, str | os.PathLike) else str(run)


class Watcher:
    """One scope at a time for a callback: started with the training, closed with it.

    Args:
        options: ``watch()``'s options, checked now. Without ``run``, the run goes to a fresh
            ``layerscope`` directory inside the one ``start`` is given; ``run=None`` keeps it
            in memory. ``capture``, the old name of ``kinds``, is taken as it with one
            FutureWarning, here rather than at each ``watch()``.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        # The frames above: the callback's __init__, then the call that made the callback.
        options = options_with_kinds(options, "LayerscopeCallback", stacklevel=3)
        check_options(options)
        self.options = dict(options)
        self.scope: Scope | None = None
        self.run_dir = run_path(options["run"]) if "run" in options else None
        self.failures = 0
        self._open = False

    def start(
        self,
        model: Any,
        optimizers: Sequence[Any],
        default_parent: Callable[[], str | None],
        global_step: int = 0,
        batches_end_steps: bool = False,
    ) -> None:
        """Watch ``model`` stepped by ``optimizers``.

        ``model`` comes from the trainer, untyped: ``watch()`` refuses what is not a module.
        ``global_step`` is the steps the trainer has done (a resumed training's): the first
        step is numbered so, unless ``start_step=`` says otherwise. The first optimizer's step
        ends a step, or with ``batches_end_steps`` no optimizer's does: each ``step()`` call
        ends one, at the end of a batch in which an optimizer stepped.

        A scope still open (a training run that raised where no hook saw it) is closed first,
        as failed. If watching fails, that warns once and training goes on unwatched.
        """
        self.close("failed")
        self.scope = None
        self.run_dir = run_path(self.options["run"]) if "run" in self.options else None
        with self.guard("watching the model"):
            options = dict(self.options)
            if "run" not in options:
                parent = default_parent()
                options["run"] = fresh_run_dir(parent if parent is not None else os.getcwd())
            options.setdefault("start_step", int(global_step))
            optimizer = optimizers[0] if len(optimizers) == 1 else list(optimizers) or None
            self.scope = watch(model, optimizer=optimizer, **options)
            if batches_end_steps:
                # Private to layerscope: the trainer's batches, not an optimizer, end steps.
                self.scope._parameters.ends_steps = False
            self._open = True
            self.run_dir = run_path(options["run"])

    def step(self, **scalars: float | Tensor) -> None:
        """``scope.step(**scalars)``: mark a skipped step, record scalars for the last step."""
        if self.scope is None or not self._open:
            return
        with self.guard("recording a step"):
            self.scope.step(**scalars)

    def close(self, status: str) -> None:
        """Close the scope (once) with ``status``: ``"finished"`` or ``"failed"``."""
        if self.scope is None or not self._open:
            return
        self._open = False
        with self.guard("closing the run"):
            self.scope.close(status)

    @contextlib.contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Turn a failure into one warning and a count; monitoring never stops training.

        ``NonFiniteError`` goes through: ``watch(alerts="raise")`` asked for it.
        """
        try:
            yield
        except NonFiniteError:
            raise
        except Exception as error:
            self.failures += 1
            if self.failures == 1:
                warnings.warn(
                    f"layerscope: {doing} failed ({type(error).__name__}: {error}); training "
                    f"goes on, later failures are only counted",
                    LayerscopeWarning,
                    stacklevel=3,
                )
