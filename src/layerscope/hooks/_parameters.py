"""Parameters and buffers: read at the optimizer's moments, or when backward ends.

With ``optimizer=``, gradients are read just before each optimizer's step (after
accumulation, unscaling and clipping; after the closure of LBFGS-style steps), the change the
step made just after it, and weights and buffers when the training step ends. Without one,
gradients are read when each backward pass ends: by the time ``scope.step()`` runs,
``zero_grad()`` may have cleared them.

One parameter, the probe, has a hook that runs once per backward pass: it tells that the model
trained in this step, so that an iteration whose optimizer step GradScaler skipped is seen
where the next one begins.

The first optimizer's step ends a training step, unless a trainer's callback ends steps at its
batches' ends instead (``ends_steps``): then each optimizer only says that it stepped. Given no
optimizer, the one found to step the watched parameters is followed (``hooks._followed``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from layerscope.distributed import local_tensor, shard_label
from layerscope.hooks._carried_grads import CarriedGradients
from layerscope.hooks._cost import CostMeter
from layerscope.hooks._followed import FollowedOptimizer, StepHook
from layerscope.hooks._grad_moment import after_backward_callbacks, closure_then
from layerscope.hooks._handles import HookHandles, weak_hook
from layerscope.hooks._optimizers import owned_by, step_held_back
from layerscope.hooks._owned_tensors import (
    backward_probe,
    entry_of,
    fp16_autocast,
    owned_tensors,
)
from layerscope.hooks._rate_bounds import RateBounds, joined, rate_bounds
from layerscope.hooks._stalled import stalled_parameters
from layerscope.hooks._steps import StepClock
from layerscope.hooks._updates import UpdateSnapshot
from layerscope.model import Kind
from layerscope.recording import GroupEntry, Recorder

TRAIN = "train"


class StepCall(enum.Enum):
    """What ``scope.step()`` does to the step in progress, with ``optimizer=``."""

    KEEP = "keep"  # an optimizer step ended it already, or nothing trained since the last end
    HOLD = "hold"  # a micro-batch whose optimizer step accelerate held back: part of the step
    END = "end"  # it ends the step: the optimizers stepped, and a trainer's batch ends steps
    SKIPPED = "skipped"  # it ends a step whose optimizer step was skipped (GradScaler)


class ParameterReads:
    """The watched modules' parameters and buffers, and the hooks that read them.

    Args:
        root: the model.
        targets: the watched modules.
        optimizers: those given to ``watch()``; the first one's step ends a training step.
        kinds: what is recorded.
        clock: steps and gates.
        recorder: where readings go.
        meter: the training thread's cost.
        fail: counts and warns of a monitoring failure.
        end_step: ends the training step (the first optimizer's step calls it).
        note_stalled: takes, on each recorded step that an optimizer ended, the reason each
            watched parameter cannot learn (``hooks._stalled``), for the health rules.
        note_rates: takes, on the same steps, how far an adaptive optimizer's step may move
            each parameter it steps (``hooks._rate_bounds``), for the health rules.
    """

    def __init__(
        self,
        root: nn.Module,
        targets: Sequence[tuple[str, nn.Module]],
        optimizers: Sequence[torch.optim.Optimizer],
        kinds: frozenset[Kind],
        clock: StepClock,
        recorder: Recorder,
        meter: CostMeter,
        fail: Callable[[str, BaseException], None],
        end_step: Callable[[], None],
        note_stalled: Callable[[int, dict[tuple[str, str], str]], None] | None = None,
        note_rates: Callable[[int, RateBounds], None] | None = None,
    ) -> None:
        self._root = root
        self._targets = list(targets)
        self._note_stalled = note_stalled
        self._note_rates = note_rates
        self._optimizers = list(optimizers)
        self._kinds = kinds
        self._clock = clock
        self._recorder = recorder
        self._meter = meter
        self._fail = fail
        self._end_step = end_step
        self._params = owned_tensors(targets, lambda m: m.named_parameters(recurse=False))
        self._buffers = owned_tensors(targets, lambda m: m.named_buffers(recurse=False))
        self._probe = backward_probe(root, self._optimizers)
        self._snapshots = [UpdateSnapshot() for _ in self._optimizers]
        self._bounds: list[RateBounds] = []  # of the recorded step in progress
        # zero_grad() missing: the scalar grad_carried of a step (health's accumulating_grad).
        self._carried = CarriedGradients(targets, self._optimizers, clock, recorder, meter, fail)
        self._positions: list[list[int]] = [[] for _ in self._optimizers]
        self._handles = HookHandles()
        self._backward_reads = HookHandles()  # the gradients' reads where no optimizer is known
        self._follower = (
            None
            if self._optimizers
            else FollowedOptimizer([p for p, _ in self._params], self._follow)
        )
        self._grad_read_queued = False
        # An optimizer step ended a step since the last scope.step(); one is under way.
        self.optimizer_ended = False
        self.optimizer_stepping = False
        # Whether the first optimizer's step ends the training step. A trainer callback that
        # steps several optimizers in any order turns it off and ends steps at batch ends.
        self.ends_steps = True
        self._stepped = False  # an optimizer stepped in the step in progress
        self._backward_in_step = False  # a backward pass reached the probe in this step
        self._fp16_pass = False  # the training pass ran under fp16 autocast (GradScaler)
        self._on_backward: Callable[[], None] = _nothing

    def register(self, on_backward: Callable[[], None]) -> None:
        """Hook the probe, the optimizers, or (without one) each gradient's accumulation.

        ``on_backward`` is called once per backward pass, from the probe's hook.
        """
        self._on_backward = on_backward
        self._carried.register()
        if self._probe is not None:
            self._handles.add(
                self._probe.register_post_accumulate_grad_hook(weak_hook(self._on_probe_grad))  # type: ignore[no-untyped-call]  # untyped in torch
            )
        for index, optimizer in enumerate(self._optimizers):
            self._handles.add(optimizer.register_step_pre_hook(partial(self._before_step, index)))
            self._handles.add(optimizer.register_step_post_hook(partial(self._after_step, index)))
        if self._follower is not None:
            self._follower.register()
        if not self._optimizers and Kind.WEIGHT_GRAD in self._kinds:
            for param, _ in self._params:
                if param.requires_grad:
                    self._backward_reads.add(
                        param.register_post_accumulate_grad_hook(
                            weak_hook(self._on_grad_accumulated)
                        )  # type: ignore[no-untyped-call]  # untyped in torch
                    )

    def remove(self) -> None:
        """Take every hook off and let go of the parameters and the update copies."""
        self._handles.remove()
        self._backward_reads.remove()
        if self._follower is not None:
            self._follower.remove()
        self._carried.remove()
        self._targets = []
        self._note_stalled = None
        self._note_rates = None
        self._bounds = []
        self._params = []
        self._buffers = []
        self._probe = None
        for snapshot in self._snapshots:
            snapshot.release()

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Those given to ``watch()``, or the one followed since it was found."""
        return self._optimizers

    def steps_given(self) -> None:
        """``scope.step()`` ends the steps: an optimizer found later is not followed."""
        if self._follower is not None:
            self._follower.steps_given()

    def _follow(self, optimizer: torch.optim.Optimizer) -> tuple[StepHook, StepHook]:
        """From its first step on, read around ``optimizer``'s steps as if it had been given."""
        self._optimizers.append(optimizer)
        self._snapshots.append(UpdateSnapshot())
        self._positions.append([])
        # Its step reads the gradients now (a reading of this step at backward is replaced).
        self._backward_reads.remove()
        index = len(self._optimizers) - 1
        return partial(self._before_step, index), partial(self._after_step, index)

    # ---------------------------------------------------------------- the step's moments

    def training_pass_begins(self) -> bool:
        """A training pass begins; return True if the last iteration's step was skipped.

        Skipped: a backward reached the probe in this step, no optimizer step followed, and
        ``zero_grad()`` has cleared the gradient since (GradScaler skipped the step). Where
        batch ends end the steps, they tell skipped steps too: a pass between two optimizers'
        steps is not a new iteration.
        """
        skipped = (
            self.ends_steps
            and bool(self._optimizers)
            and self._backward_in_step
            and not self.optimizer_stepping
            and self._probe is not None
            and self._probe.grad is None
        )
        self._fp16_pass = self._probe is not None and fp16_autocast(self._probe)
        return skipped

    def at_step_call(self, trained: bool) -> StepCall:
        """What ``scope.step()`` does now; ``trained``: a training pass ran in this step."""
        if self.optimizer_ended or self.optimizer_stepping:
            return StepCall.KEEP
        if not self.ends_steps:
            if self._stepped:
                return StepCall.END
            return StepCall.SKIPPED if trained else StepCall.KEEP
        if not trained:
            return StepCall.KEEP
        return StepCall.HOLD if step_held_back() else StepCall.SKIPPED

    def read_at_step_end(self, skipped: bool) -> None:
        """Weights and buffers as the step leaves them; a skipped step's gradients too."""
        if skipped:  # what backward left, unless zero_grad() has cleared it already
            self.read(Kind.WEIGHT_GRAD)
        elif self._note_stalled is not None and self.optimizer_ended and self._optimizers:
            # Just after the optimizer's step: the gradients it applied are still there.
            try:
                stalled = stalled_parameters(self._root, self._targets, self._optimizers)
                self._note_stalled(self._clock.step, stalled)
            except Exception as error:
                self._fail("reading which parameters can learn", error)
        bounds, self._bounds = joined(self._bounds), []
        if bounds is not None and self._note_rates is not None and not skipped:
            self._note_rates(self._clock.step, bounds)
        self.read(Kind.WEIGHT)
        self.read(Kind.BUFFER)

    def step_ended(self) -> None:
        """The step in progress has ended; the clock already shows the next one."""
        if not self._clock.step_records:
            for snapshot in self._snapshots:
                snapshot.release()  # kept only from one recorded step to the next
        self._bounds = []  # noted at the step's end, or of no step now
        if self._follower is not None:
            self._follower.step_ended()
        self._backward_in_step = False
        self.optimizer_stepping = False
        self._stepped = False

    def read(self, kind: Kind, positions: Sequence[int] | None = None) -> None:
        """Record ``kind`` (weights, their gradients or buffers) of the watched modules."""
        if kind in self._kinds:
            # Read together: on a GPU one launch pair per dtype, not one per tensor.
            entries = self._entries(kind, positions)
            self._recorder.record_group(self._clock.step, kind, TRAIN, entries)

    def watch_grads(self, positions: Sequence[int] | None = None) -> None:
        """The gradients' sentinel: the extremes of the parameters' gradients, read together."""
        entries = self._entries(Kind.WEIGHT_GRAD, positions)
        self._recorder.record_group_extremes(self._clock.step, Kind.WEIGHT_GRAD, TRAIN, entries)

    def _entries(self, kind: Kind, positions: Sequence[int] | None) -> list[GroupEntry]:
        """What there is to read of ``kind`` (of the parameters at ``positions``, or all)."""
        owned = self._buffers if kind is Kind.BUFFER else self._params
        chosen = owned if positions is None else [owned[i] for i in positions]
        entries = []
        for tensor, owners in chosen:
            value = tensor.grad if kind is Kind.WEIGHT_GRAD else tensor
            if value is not None:
                entries.append(entry_of(owners, value))
        return entries

    # ---------------------------------------------------------------- hooks

    def _on_probe_grad(self, param: Tensor) -> None:
        """A backward pass reached the probe parameter: one call per backward pass."""
        if torch.compiler.is_compiling() or not len(self._handles):
            return
        self._backward_in_step = True
        self._on_backward()
        if self._follower is not None:
            self._follower.backward_ran(param, self._clock.step)
        if self._fp16_pass and self._clock.step_records and Kind.WEIGHT_GRAD in self._kinds:
            # Under fp16 autocast, GradScaler may skip the step and its gradients would go
            # unread: read them as backward leaves them (scaled); the optimizer step's reading,
            # unscaled, replaces this one when the step comes.
            self._on_grad_accumulated(param)

    def _on_grad_accumulated(self, param: Tensor) -> None:
        clock = self._clock
        read = clock.step_records or clock.watching_gradients
        if read and not self._grad_read_queued and len(self._handles):
            self._grad_read_queued = True
            after_backward_callbacks(self._read_grads_after_backward)  # after DDP's write-back

    def _read_grads_after_backward(self) -> None:
        self._grad_read_queued = False
        # Each backward pass overwrites the last: after the final micro-batch, the reading is
        # of the accumulated gradient.
        if self._clock.step_records:
            self._meter.timed(self.read, Kind.WEIGHT_GRAD)
        else:
            self._meter.timed(self.watch_grads)

    def _before_step(
        self, index: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if not len(self._handles):
            return None
        self.optimizer_stepping = True
        records = self._clock.step_records
        if not (records or self._clock.watching_gradients):
            return None
        positions = self._positions[index] = owned_by(
            self._optimizers, index, [param for param, _ in self._params]
        )
        if records:
            self._meter.timed(self._snapshot, index)
            read = partial(self.read, Kind.WEIGHT_GRAD, positions)
        else:  # the gradients' sentinel
            read = partial(self.watch_grads, positions)
        # The closure computes the gradients (LBFGS, Lightning): read them when it returns.
        changed = closure_then(args, kwargs, partial(self._meter.timed, read))
        if changed is None:
            if records and self._fp16_pass:
                # GradScaler unscaled the gradients read at backward in place, and torch's op
                # leaves their version as it was: bump it, or that scaled reading is reused.
                grads = [self._params[i][0].grad for i in positions]
                torch.autograd.graph.increment_version([g for g in grads if g is not None])
            self._meter.timed(read)
        return changed

    def _after_step(
        self, index: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> None:
        if not len(self._handles):
            return
        start = time.perf_counter()
        try:
            self.optimizer_stepping = False
            self._stepped = True
            if self._clock.step_records:
                self._record_updates(index)
            if index == 0 and self.ends_steps:  # the first optimizer's step ends the step
                self.optimizer_ended = True
                self._end_step()
        finally:
            self._meter.seconds += time.perf_counter() - start

    # ---------------------------------------------------------------- updates

    def _snapshot(self, index: int) -> None:
        if self._note_rates is not None:
            try:
                params = [self._params[i] for i in self._positions[index]]
                bounds = rate_bounds(self._optimizers[index], params)
                if bounds is not None:
                    self._bounds.append(bounds)
            except Exception as error:
                self._fail("reading the optimizer's rates", error)
        if Kind.UPDATE in self._kinds:
            snapshot = self._snapshots[index]
            try:  # DTensors as their local shards: an op on a whole one may be a collective
                snapshot.take([local_tensor(self._params[i][0]) for i in self._positions[index]])
            except Exception as error:
                snapshot.release()
                self._fail("copying the parameters before the step", error)

    def _record_updates(self, index: int) -> None:
        if Kind.UPDATE not in self._kinds:
            return
        positions = self._positions[index]
        try:
            params = [self._params[i][0] for i in positions]
            updates = self._snapshots[index].updates([local_tensor(param) for param in params])
            if updates is not None:
                entries = [
                    entry_of(self._params[position][1], update, shard_label(param))
                    for position, param, update in zip(positions, params, updates, strict=True)
                ]
                self._recorder.record_group(self._clock.step, Kind.UPDATE, TRAIN, entries)
        except Exception as error:
            self._fail("reading the updates", error)


def _nothing() -> None:
    pass
