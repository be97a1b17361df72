"""``Scope``: what ``watch()`` returns: the steps, the run, and the scope's end.

The hot path is the hooks (``LayerHooks`` on modules, ``ParameterReads`` on parameters and
optimizers): each checks the ``StepClock``'s gates and hands tensors to the ``Recorder``, which
computes their partials on their device and appends them to a device buffer. No hook reads a
value back to the host. At the end of a recorded step the buffers start their copy to the host
(one per device, non-blocking on CUDA) and the batch goes to the writer thread, which waits for
the copy, merges, finalises and hands the rows to the sinks.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from layerscope._config import WatchConfig
from layerscope._errors import FailureCounter, LayerscopeWarning
from layerscope.distributed import ProcessRank
from layerscope.health import HealthMonitor
from layerscope.hooks import (
    AttentionWatch,
    CostMeter,
    InputGradients,
    LayerHooks,
    MicroBatchScalars,
    ModuleClaims,
    NoiseScale,
    ParameterReads,
    StepCall,
    StepClock,
    nonfinite_error,
    stop_schedule,
)
from layerscope.model import Identities, Kind, is_compiled, module_tree, selected, unwrap
from layerscope.recording import Recorder, Target
from layerscope.scope import _lifecycle as lifecycle
from layerscope.scope._readback import RecordedReads
from layerscope.scope._run_info import run_summary
from layerscope.scope._whole_tensors import WholeTensors
from layerscope.sinks import FanOut, MemorySink, Sink
from layerscope.tensors import Record, TensorsSpec
from layerscope.writer import Pipeline, rank_merge_for

if TYPE_CHECKING:
    from layerscope.store import ParquetStore


class Scope(RecordedReads):
    """Records statistics of a model's layers; made by ``layerscope.watch``.

    Use it as a context manager, or call ``close()``: either removes every hook. Call
    ``step(**scalars)`` once per training step, unless ``optimizer=`` was given (or an
    optimizer is followed), in which case ``optimizer.step()`` ends the step. ``frame()``
    returns what was recorded.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        config: WatchConfig,
        sinks: Sequence[Sink] = (),
        store: ParquetStore | None = None,
        tensors: TensorsSpec | None = None,
        on_tensor: Callable[[Record, Path | None], object] | None = None,
        workers: int = 0,
    ) -> None:
        self.config = config
        self._tensors_spec = tensors
        self._root = unwrap(model)
        self._optimizers = list(optimizers)
        self._place = ProcessRank()  # the rank is asked for when first needed
        self._failures = FailureCounter()
        self._meter = CostMeter()
        # The sentinels watch activations and output gradients, or the parameters' gradients,
        # on the steps not recorded.
        sentinel = bool(config.kinds & {Kind.ACTIVATION, Kind.GRAD})
        self._stops = config.alerts.raise_on_nonfinite
        self._clock = StepClock(
            stop_schedule(config),
            sentinel,
            self._on_accelerator,
            config.start_step,
            has_gradient_sentinel=Kind.WEIGHT_GRAD in config.kinds,
        )
        self._closed = False
        self._identities = Identities()
        self._held_scalars = MicroBatchScalars()  # of micro-batches accelerate held back

        targets = selected(self._root, config.selection)
        self._targets = [(Target(name, type(m).__name__), m) for name, m in targets]
        # Another open scope on the same modules would double every hook: refused.
        self._claims = ModuleClaims.claim([self._root, *(m for _, m in targets)], self)
        self._modules = module_tree(self._root, {name for name, _ in targets})

        # Without a store the records stay in memory, for frame().
        self._store = store
        self._memory: MemorySink | None = None
        main: Sink
        if store is None:
            main = self._memory = MemorySink()
        else:
            main = store
        # The store starts last: a sink that fails to start then leaves no run directory
        # behind to block a retry at the same path.
        self._sink = FanOut([*sinks, main], len(sinks), self._fail)
        self._started = time.time()
        try:
            self._sink.start(self._run_info())
        except BaseException:
            self._claims.release()
            raise
        health = HealthMonitor.for_run(config.alerts, self._modules, targets, optimizers)
        self._pipeline = Pipeline(
            self._sink,
            place=self._place,
            selection=config.stats,
            identities=self._identities,
            failures=self._failures,
            # Without a store, the in-memory sink takes the store's default cadence.
            flush_steps=10 if store is None else store.flush_steps,
            flush_seconds=5.0 if store is None else store.flush_seconds,
            queue_size=256 if store is None else store.queue_size,
            health=health,
            rank_merge=rank_merge_for(config, self._identities, self._modules),
        )
        try:  # the hooks made, not yet on the model: a failure stops the writer, drops the run
            self._recorder = Recorder(
                config.histogram,
                config.stats.custom,
                self._identities,
                self._pipeline,
                self._fail,
                custom_by_kind=config.stats.by_kind,
            )
            self._recorder.open_steps = self._clock.open_steps
            self._layers = LayerHooks(
                self._root, self._targets, config.kinds, self._clock, self._recorder,
                self._pipeline, self._meter, self._fail, on_training_pass=self._on_training_pass,
                compiled=is_compiled(model, self._root),
                note_output=None if health is None else health.note_output,
            )  # fmt: skip
            self._parameters = ParameterReads(
                self._root,
                targets,
                self._optimizers,
                config.kinds,
                self._clock,
                self._recorder,
                self._meter,
                self._fail,
                end_step=self._finish_step,
                note_stalled=None if health is None else health.note_stalled,
                note_rates=None if health is None else health.note_rates,
            )
            self._noise = NoiseScale(self._root, targets, config.noise_scale, self._clock,
                                     self._recorder, self._meter, self._fail)  # fmt: skip
            self._attention = AttentionWatch(self._root, config.attention, self._clock,
                                             self._recorder, self._meter, self._fail)  # fmt: skip
            if config.attention:  # a watch without it does nothing of it as passes begin
                self._layers.follow(self._attention.sync)
            hooked = self._targets if Kind.INPUT_GRAD in config.kinds else []
            self._input_grads = InputGradients(hooked, self._clock, self._recorder, self._meter,
                                               self._fail, self._layers.training_call)  # fmt: skip
            self._layers.follow(self._input_grads.sync)
        except BaseException:
            self._closed = True
            summary = partial(run_summary, "failed", 0, self._failures, self._meter, self._root)
            lifecycle.abandon(self._pipeline, self._claims, summary, store)
            raise
        # A scope left open at exit is closed then, so the writer writes what it holds.
        lifecycle.track(self)
        self._whole: WholeTensors | None = None
        try:
            self._layers.register()
            self._parameters.register(on_backward=self._layers.backward_ended)
            self._noise.step_begins()
            if tensors is not None:
                self._whole = WholeTensors(
                    self._root,
                    tensors,
                    store,
                    self._place,
                    self._failures,
                    step_now=lambda: self._clock.pass_step,
                    training_now=lambda: self._clock.training,
                    records_statistics=config.schedule.records,
                    first_step=config.start_step,
                    on_tensor=on_tensor,
                    workers=workers,
                    optimizers=self._optimizers,
                )
        except BaseException:
            self.close("failed")
            if store is not None:  # a watch() that failed leaves no run behind
                store.discard()
            raise

    # ---------------------------------------------------------------- public surface

    @property
    def current_step(self) -> int:
        """The step in progress: training forwards and backwards now are recorded under it."""
        return self._clock.step

    def step(self, **scalars: float | Tensor) -> None:
        """End the training step and record scalars such as ``loss=`` or ``lr=`` for it.

        With ``optimizer=`` the optimizer's step ends the training step instead: then this
        records the scalars for the step the optimizer just ended, and ends the step only if
        the optimizer did not step since the last call although the model trained (a step
        that GradScaler skipped): call it once per iteration, after the optimizer step. On a
        micro-batch whose step accelerate held back (``accelerator.sync_gradients`` False) it
        ends nothing: the step is the window's, and records each scalar's mean over it.
        Scalar tensors are kept on their device until the next flush, so passing ``loss``
        costs no host sync.

        Examples:
            >>> import torch, layerscope
            >>> model = torch.nn.Linear(3, 1)
            >>> with layerscope.watch(model, every=1) as scope:
            ...     model(torch.ones(2, 3)).sum().backward()
            ...     scope.step(loss=1.5)
            >>> scope.frame("scalars").to_dict("records")
            [{'step': 0, 'name': 'loss', 'value': 1.5}]
        """
        self._check_open("step")
        start = time.perf_counter()
        clock = self._clock
        try:
            scalars = self._layers.with_loss_findings(scalars)
            if not self._parameters.optimizers:  # the loop ends its own steps
                self._parameters.steps_given()
                self._recorder.add_scalars(clock.step, scalars)
                self._finish_step()
                return
            call = self._parameters.at_step_call(clock.trained)
            if call is StepCall.HOLD:  # a micro-batch: its scalars wait for its step's end
                self._held_scalars.hold(scalars)
                return
            scalars = self._held_scalars.merged(scalars)
            if call is not StepCall.KEEP:
                self._finish_step(skipped=call is StepCall.SKIPPED)
            self._parameters.optimizer_ended = False
            ended = clock.ended
            self._recorder.add_scalars(clock.step if ended is None else ended, scalars)
            if self._recorder.holding or (ended is not None and scalars and clock.records(ended)):
                # The step's rows waited at its optimizer step for its loss: both go now, in
                # one batch and so one segment, and a killed run keeps neither without the other.
                self._flush_so_far("flushing a step")
        finally:
            self._meter.seconds += time.perf_counter() - start

    def flush(self) -> None:
        """Wait until what the steps so far recorded is written to the run and every sink.

        Call it between steps, to read a run while it trains: training never needs it.
        """
        self._check_open("flush")
        self._flush_so_far()
        self._pipeline.drain()
        if self._whole is not None:
            self._whole.drain()

    def _catch_up(self) -> None:
        """Before reading what was recorded: warn of failures, write every step so far."""
        self._failures.warn_pending()
        if not self._closed:
            self._flush_so_far()
            self._pipeline.drain()

    def _flush_so_far(self, doing: str = "flushing") -> None:
        """Send what is complete now: evaluation rows, scalars, the sentinel's readings.

        The step in progress's training rows wait for its end; an ended step's rows that
        waited for its scalars go whole. ``doing`` names it in a failure's warning.
        """
        try:
            self._recorder.send_complete()
        except Exception as error:
            self._fail(doing, error)

    def close(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Remove every hook and finish recording; what the current step has so far is kept.

        Args:
            status: how the run ended, saved with it: ``"finished"``, or ``"failed"`` (as an
                exception leaving the ``with`` or ending the script passes).
            timeout: seconds to wait for the writer to finish the run; None waits for it.
                If it has not finished by then, a warning says so and the writer goes on.

        Safe to call twice. ``frame()`` still works afterwards.
        """
        if self._closed:
            return
        self._closed = True
        lifecycle.untrack(self)
        try:
            if self._held_scalars:  # an accumulation window the training left unfinished
                self._recorder.add_scalars(self._clock.step, self._held_scalars.merged({}))
            if self._recorder.has_pending():
                self._recorder.flush(final=True)
            self._layers.send_calls()
        except Exception as error:
            self._fail("flushing the last step", error)
        finally:
            self._layers.remove()
            self._parameters.remove()
            self._noise.remove()
            self._attention.remove()
            self._input_grads.remove()
            self._claims.release()
            if self._whole is not None:
                self._whole.close(timeout)
            steps = self._clock.step + self._clock.trained  # an unfinished step counts
            summary = partial(run_summary, status, steps, self._failures, self._meter, self._root)
            finished = self._pipeline.close(summary, timeout)
            self._failures.warn_pending()
            self._pipeline.log_alerts()
        if not finished:
            warnings.warn(
                f"layerscope: the writer did not finish the run in {timeout} s (a sink "
                f"hangs?); what it had not written is lost",
                LayerscopeWarning,
                stacklevel=2,
            )

    def __enter__(self) -> Scope:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close("failed" if exc_type is not None else "finished")

    def __repr__(self) -> str:
        return f"<Scope {type(self._root).__name__}, {len(self._targets)} modules, {self._state()}>"

    # ---------------------------------------------------------------- steps

    def _on_training_pass(self) -> None:
        """A training pass begins: the last iteration may have ended with no optimizer step."""
        if self._parameters.training_pass_begins():
            self._finish_step(skipped=True)

    def _finish_step(self, skipped: bool = False) -> None:
        """Read what a step ends with, then end it; a skipped step says so in the scalars."""
        clock = self._clock
        if clock.step_records:
            self._parameters.read_at_step_end(skipped)
        self._noise.step_ends(clock.step, skipped)
        # Raised once the step has ended, so that the scope stays whole to be closed.
        stop = nonfinite_error(self._recorder, clock.step, skipped) if self._stops else None
        if skipped:
            self._recorder.add_scalars(clock.step, {"skipped": 1.0})
        try:
            # With an optimizer, the step's scalars come after its end (see step()).
            self._recorder.end_step(
                clock.step_records, scalars_follow=bool(self._parameters.optimizers)
            )
        except Exception as error:
            self._fail("flushing a step", error)
        self._layers.step_ended(stepped=not skipped)
        ended = clock.end_step()
        if self._whole is not None:
            try:
                self._whole.end_step(ended, clock.step)
            except Exception as error:
                self._fail("keeping whole tensors", error)
        self._layers.sync()
        self._parameters.step_ended()
        self._noise.step_begins()
        self._failures.warn_pending()
        self._pipeline.log_alerts()
        if stop is not None:
            raise stop

    def _on_accelerator(self) -> bool:
        """Whether the model's parameters are on a GPU or another accelerator now."""
        first = next(self._root.parameters(), None)
        return first is not None and first.device.type != "cpu"

    def _fail(self, where: str, error: BaseException) -> None:
        self._failures.record(where, error)
        self._failures.warn_pending()

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise RuntimeError(f"{action}: this scope is closed")
