"""The hooks on a model's modules: forward passes, activations, inputs and output gradients.

A forward pass begins where the model is entered: at its root's forward, or, where that never
runs (Lightning's ``training_step`` calls ``self.net(x)``), at a child of the root. Call
indices count within a pass, so micro-batches and evaluation batches of a step merge by call.
Every hook checks the ``StepClock``'s gates (Python bools) first and hands tensors to the
``Recorder``; none reads a value back to the host.

The watched modules' own hooks are on them only while a step may record or watch: a module
with no hook takes torch's fast path, so an unrecorded step costs only the entry hooks where
the model is entered. A compiled model keeps them for good: dynamo does not see hooks added
after its first compiled call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from layerscope.hooks import _gates as gates
from layerscope.hooks._call_log import CallLog
from layerscope.hooks._cost import CostMeter
from layerscope.hooks._handles import HookHandles, in_backward
from layerscope.hooks._loss_graph import LossGraph, Scalars
from layerscope.hooks._output_spread import OutputSpread
from layerscope.hooks._steps import StepClock
from layerscope.hooks._train_modes import TrainModes
from layerscope.hooks._values import InputNames, named_tensors
from layerscope.model import CallEvent, Kind
from layerscope.recording import Recorder, Target
from layerscope.stats import follow_eager_stance, release_eager_stance
from layerscope.writer import Pipeline

TRAIN = "train"
EVAL = "eval"


class LayerHooks:
    """Forward, entry and gradient hooks of the watched modules, and the passes they see.

    Args:
        root: the model as a person thinks of it (wrappers looked through).
        targets: the watched modules.
        kinds: what is recorded.
        clock: steps and gates.
        recorder: where readings go.
        pipeline: where each recorded step's call order goes.
        meter: the training thread's cost.
        fail: counts and warns of a monitoring failure.
        on_training_pass: called when a training pass begins, before it is counted (a step
            that GradScaler skipped ends there).
        compiled: the model was compiled when watched: hooks stay on between steps.
        note_output: takes the spread of the model's output at recorded steps, for the
            health rules, while they want it (``hooks._output_spread``).
    """

    def __init__(
        self,
        root: nn.Module,
        targets: Sequence[tuple[Target, nn.Module]],
        kinds: frozenset[Kind],
        clock: StepClock,
        recorder: Recorder,
        pipeline: Pipeline,
        meter: CostMeter,
        fail: Callable[[str, BaseException], None],
        on_training_pass: Callable[[], None],
        compiled: bool = False,
        note_output: Callable[[int, Tensor, int], bool] | None = None,
    ) -> None:
        self._root = root
        self._targets = list(targets)
        self._kinds = kinds
        self._clock = clock
        self._recorder = recorder
        self._meter = meter
        self._fail = fail
        self._on_training_pass = on_training_pass

        self._handles = HookHandles()  # the entry hooks
        self._target_handles = HookHandles()  # on the watched modules, while needed
        self._call_order_handles = HookHandles()  # target pre-hooks kept for the call log
        self._child_entry_handles = HookHandles()
        self._static = compiled
        self._entries: set[int] = set()  # ids of the root and its children
        self._entry_depth = 0
        self._pass_entries: set[int] = set()  # ids of the modules that entered this pass
        self._pass_ended = True  # a backward pass ended since the pass began
        self._modes = TrainModes(root, [(t.name, m) for t, m in self._targets], recorder)
        self._call_counts: dict[tuple[str, str], int] = {}
        self._checkpointed: dict[str, list[int]] = {}  # calls whose grads wait for recompute
        self._call_log = CallLog(pipeline)
        self._calls_open = True  # the step's first training pass is logging its call order
        self._followers: list[Callable[[], None]] = []
        self._loss_graph = LossGraph(fail)  # probabilities fed to a loss taking logits
        self._output_spread = OutputSpread(note_output, fail)  # does the output follow inputs

    @property
    def calls(self) -> list[CallEvent]:
        """Each recorded step's call order: its first training pass's enters and exits."""
        return self._call_log.every_step()

    # ---------------------------------------------------------------- registration

    def register(self) -> None:
        """Put the entry hooks on the model, and the watched modules' if the step needs them."""
        root = self._root
        entry = gates.entry_gated(self._clock, self._on_entry)
        leave = gates.entry_gated(self._clock, self._on_leave)
        self._handles.add(root.register_forward_pre_hook(entry, prepend=True))
        self._handles.add(root.register_forward_hook(leave, always_call=True))
        # Children are entry points only until the root's forward is seen to run.
        children = {id(child): child for child in root.children()}
        self._entries = {id(root), *children}
        for child in children.values():
            self._child_entry_handles.add(child.register_forward_pre_hook(entry, prepend=True))
            self._child_entry_handles.add(child.register_forward_hook(leave, always_call=True))
        # How each forward names its inputs, read from its signature once, here.
        names = InputNames.cache()
        self._on_enter_hooks = [
            gates.gated(
                self._clock,
                partial(self._on_enter, target, module, names(module)),
            )
            for target, module in self._targets
        ]
        self._on_exit_hooks = [
            gates.gated(self._clock, partial(self._on_exit, target, module))
            for target, module in self._targets
        ]
        self.sync()

    def sync(self) -> None:
        """Put the watched modules' hooks on, or take them off, as the clock's gates say."""
        gates.prepare_for_dynamo()
        try:
            follow_eager_stance(self, self._clock.step_records)
        except Exception as error:  # compiled steps then record through graph breaks
            self._fail("setting torch.compile's stance", error)
        self._clock.gates_follow_passes = not self._static
        wanted = self._static or self._clock.recording or self._clock.watching
        if wanted and not len(self._target_handles):
            self._attach()
        elif not wanted and len(self._target_handles) and not self._stays_static():
            self._target_handles.remove()
        self._sync_call_log(wanted)
        for sync in self._followers:
            sync()

    def training_call(self, module: str) -> int:
        """The index of ``module``'s training call now under way (its exit counts it)."""
        return self._call_counts.get((module, TRAIN), 0)

    def follow(self, sync: Callable[[], None]) -> None:
        """Call ``sync`` wherever these hooks are synced: as a pass begins, as a step ends."""
        self._followers.append(sync)

    def remove(self) -> None:
        """Take every hook off; safe to call twice."""
        release_eager_stance(self)
        self._handles.remove()
        self._target_handles.remove()
        self._call_order_handles.remove()
        self._child_entry_handles.remove()
        self._checkpointed.clear()

    def _attach(self) -> None:
        for (_, module), enter, exit_ in zip(
            self._targets, self._on_enter_hooks, self._on_exit_hooks, strict=True
        ):
            if Kind.INPUT in self._kinds:
                pre = module.register_forward_pre_hook(enter, with_kwargs=True)
                self._target_handles.add(pre)
            self._target_handles.add(module.register_forward_hook(exit_))

    def _sync_call_log(self, wanted: bool) -> None:
        """The pre-hooks that log entries: on a recorded step only (input hooks log too).

        A compiled model's hooks must not come and go: there only the first recorded step's
        order is logged, as hooks added after the first compiled call never fire.
        """
        if self._static:
            log = not self._call_log.sent_any and Kind.INPUT not in self._kinds
        else:
            log = wanted and self._clock.step_records and Kind.INPUT not in self._kinds
        if log and not len(self._call_order_handles):
            for (_, module), enter in zip(self._targets, self._on_enter_hooks, strict=True):
                pre = module.register_forward_pre_hook(enter, with_kwargs=True)
                self._call_order_handles.add(pre)
        elif not log and len(self._call_order_handles):
            self._call_order_handles.remove()

    def _stays_static(self) -> bool:
        """Whether the hooks stay on for good: once the user compiled anything, they do."""
        self._static = self._static or gates.user_compiled_anything()
        return self._static

    # ---------------------------------------------------------------- passes

    def _on_entry(self, module: nn.Module, args: Any) -> None:
        if id(module) not in self._entries:
            return  # a copy of the model (deepcopy keeps hooks): not the model watched
        start = time.perf_counter()
        try:
            if self._entry_depth == 0 and not in_backward():
                self._begin_pass(module)
        except Exception as error:
            self._fail("beginning a forward pass", error)
        finally:
            self._entry_depth += 1
            self._meter.seconds += time.perf_counter() - start

    def _on_leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if id(module) in self._entries:
            self._entry_depth = max(0, self._entry_depth - 1)
            if module is self._root and not self._entry_depth and self._clock.recording:
                trained = self._phase() == TRAIN and not in_backward()
                self._output_spread.read(output, trained, self._clock.pass_step)

    def _begin_pass(self, module: nn.Module) -> None:
        """The model is entered at ``module``, the root or one of its children.

        At the root every entry is a pass. At children, a pass goes on while other children
        enter it (an encoder, then a decoder) and ends when one enters again or a backward
        pass has ended: then micro-batches and validation batches merge by call.
        """
        root = module is self._root
        if root and len(self._child_entry_handles):
            self._child_entry_handles.remove()  # the model is entered at its root
        training = self._modes.pass_begins(module, torch.is_grad_enabled())
        if (
            not root
            and not self._pass_ended
            and training == self._clock.training
            and self._pass_entries
            and id(module) not in self._pass_entries
        ):
            self._pass_entries.add(id(module))  # another part of the same pass
            return
        self._pass_entries = {id(module)}
        self._pass_ended = False
        if training:
            self._on_training_pass()
        closed = self._clock.begin_pass(training)
        self.sync()
        if closed:  # the last step's evaluation is over: its rows are complete
            try:
                self._recorder.send_complete(readings_only=True)
            except Exception as error:
                self._fail("flushing an evaluation", error)
        self._call_counts.clear()
        if self._call_log.events:
            self._calls_open = False  # one pass is the call order

    def backward_ended(self) -> None:
        """A backward pass has run: the next forward is a pass of its own."""
        self._pass_ended = True
        self._modes.backward_ran()

    def step_ended(self, stepped: bool = True) -> None:
        """The step in progress ends: its call order is sent; passes start over.

        ``stepped``: an optimizer step ended it (not skipped), so its passes trained.
        """
        try:
            self._modes.step_ended(self._clock.step, stepped)
        except Exception as error:
            self._fail("reading the modules' train and eval modes", error)
        self.send_calls()
        self._calls_open = True
        self._pass_entries = set()  # the next forward begins a pass
        self._call_counts.clear()
        self._checkpointed.clear()

    def with_loss_findings(self, scalars: Scalars) -> Scalars:
        """``scalars`` of ``scope.step``, and what the loss's graph shows, once (``LossGraph``)."""
        return scalars if not self._loss_graph.pending else self._loss_graph.with_findings(scalars)

    def send_calls(self) -> None:
        """Send the call order of the step in progress (``same`` if it is the last one's)."""
        self._call_log.send()

    # ---------------------------------------------------------------- module hooks

    def _phase(self) -> str:
        if self._entry_depth or self._pass_entries:  # in a pass, or right after its root left
            return TRAIN if self._clock.training else EVAL
        training = self._root.training or self._modes.trains_in_eval
        return TRAIN if training and torch.is_grad_enabled() else EVAL

    def _on_enter(
        self,
        target: Target,
        watched: nn.Module,
        names: InputNames,
        module: nn.Module,
        args: Any,
        kwargs: Any,
    ) -> None:
        # A copy of the model (an EMA copy made by deepcopy keeps the hooks) is not watched.
        if not self._clock.recording or in_backward() or module is not watched:
            return
        start = time.perf_counter()
        try:
            phase = self._phase()
            call = self._call_counts.get((target.name, phase), 0)
            if phase == TRAIN and self._calls_open:
                self._log_call("enter", target, call)
            if Kind.INPUT in self._kinds:
                step = self._clock.pass_step
                for name, tensor in names.named(args, kwargs):
                    self._recorder.record(step, target, Kind.INPUT, name, call, phase, tensor)
        except Exception as error:
            self._fail(f"the input hook of {target.name!r}", error)
        finally:
            self._meter.seconds += time.perf_counter() - start

    def _on_exit(
        self, target: Target, watched: nn.Module, module: nn.Module, args: Any, output: Any
    ) -> None:
        clock = self._clock
        if not (clock.recording or clock.watching) or module is not watched:
            return
        start = time.perf_counter()
        try:
            if in_backward():
                self._on_recompute(target, output)
                return
            phase = self._phase()
            if not clock.recording and phase != TRAIN:
                return  # the sentinel watches training, not evaluation
            key = (target.name, phase)
            call = self._call_counts.get(key, 0)
            self._call_counts[key] = call + 1
            if phase == TRAIN and self._calls_open and clock.recording:
                self._log_call("exit", target, call)
            record = self._recorder.record if clock.recording else self._recorder.record_extremes
            step = clock.pass_step
            if Kind.ACTIVATION in self._kinds:
                for name, tensor in named_tensors(output, "out"):
                    try:  # one output that cannot be read must not cost the others theirs
                        record(step, target, Kind.ACTIVATION, name, call, phase, tensor)
                    except Exception as error:
                        self._fail(f"reading {name!r} of {target.name!r}", error)
            if Kind.GRAD in self._kinds and phase == TRAIN:
                hooked = self._hook_grads(target, call, output)
                if not hooked and not torch.is_grad_enabled():
                    # Inside a reentrant checkpoint: the output joins the graph when the
                    # forward is recomputed during backward, and is hooked then.
                    self._checkpointed.setdefault(target.name, []).append(call)
        except Exception as error:
            self._fail(f"the forward hook of {target.name!r}", error)
        finally:
            self._meter.seconds += time.perf_counter() - start

    def _on_recompute(self, target: Target, output: Any) -> None:
        """A checkpointed forward runs again during backward.

        Its statistics are already recorded; only outputs that missed their gradient hook the
        first time (inside a reentrant checkpoint, under no_grad) get it now.
        """
        pending = self._checkpointed.get(target.name)
        if Kind.GRAD in self._kinds and pending:
            # Segments recompute last first, so the latest unhooked call is the one running.
            self._hook_grads(target, pending.pop(), output)

    def _hook_grads(self, target: Target, call: int, output: Any) -> bool:
        hooked = False
        for name, tensor in named_tensors(output, "out"):
            # A leaf (a parameter returned as it is) would keep its hook for good, one more
            # each call; its gradient is read where it accumulates, as weight_grad.
            if tensor.requires_grad and not tensor.is_leaf:
                tensor.register_hook(partial(self._on_grad, target, name, call))  # type: ignore[no-untyped-call]  # untyped in torch
                hooked = True
                if self._loss_graph.pending and self._clock.recording:  # not the sentinel's
                    self._loss_graph.tag(target.name, tensor)
        return hooked

    def _on_grad(self, target: Target, name: str, call: int, grad: Tensor | None) -> None:
        clock = self._clock
        if not (clock.recording or clock.watching) or grad is None or not len(self._handles):
            return  # also after remove(): a graph built before it may still run backward
        start = time.perf_counter()
        try:
            record = self._recorder.record if clock.recording else self._recorder.record_extremes
            record(clock.step, target, Kind.GRAD, name, call, TRAIN, grad)
        except Exception as error:
            self._fail(f"the gradient hook of {target.name!r}", error)
        finally:
            self._meter.seconds += time.perf_counter() - start

    def _log_call(self, event: str, target: Target, call: int) -> None:
        if self._static and self._call_log.sent_any:
            return  # a compiled model's entry hooks are gone after its first order (see above)
        self._call_log.log(self._clock.step, event, target, call)
