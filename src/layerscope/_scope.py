"""``Scope``: the hooks on a model, the steps they are recorded under, and the scope's end.

The hot path is the hooks: each one checks a Python bool (is this step recorded?) and hands
the tensor to the ``Recorder``, which computes its partials on its device and appends them to
a device buffer. No hook reads a value back to the host. At the end of a recorded step the
buffers start their copy to the host (one per device, non-blocking on CUDA) and the batch goes
to the writer thread, which waits for the copy, merges, finalises and hands the rows to the
sinks.
"""

from __future__ import annotations

import atexit
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from layerscope._config import WatchConfig
from layerscope._errors import FailureCounter
from layerscope._hooks import HookHandles, ModuleClaims, in_backward, queue_at_backward_end
from layerscope._imports import require
from layerscope._kinds import Kind
from layerscope._modules import CallEvent, ModuleInfo, module_tree
from layerscope._optimizers import owned_by
from layerscope._pipeline import Pipeline
from layerscope._ranks import ProcessRank
from layerscope._recorder import Owner, Recorder, Target
from layerscope._schedule import Schedule
from layerscope._select import select, unwrap
from layerscope._shards import local_tensor, shard_label
from layerscope._steps import StepClock
from layerscope._table import (
    KEY_COLUMNS,
    META_COLUMNS,
    Identities,
    chunks_to_columns,
)
from layerscope._tree import named_tensors
from layerscope._updates import UpdateSnapshot
from layerscope.sinks._base import FanOut, Records, RunInfo, RunSummary, Sink
from layerscope.sinks._memory import MemorySink

if TYPE_CHECKING:
    import pandas

TRAIN = "train"
EVAL = "eval"


class Scope:
    """Records statistics of a model's layers; made by ``layerscope.watch``.

    Use it as a context manager, or call ``close()``: either removes every hook. Call
    ``step(**scalars)`` once per training step, unless ``optimizer=`` was given, in which case
    ``optimizer.step()`` ends the step. ``frame()`` returns what was recorded.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        config: WatchConfig,
        sinks: Sequence[Sink] = (),
        store: Any = None,
    ) -> None:
        self.config = config
        self._root = unwrap(model)
        self._optimizers = list(optimizers)
        self._kinds = config.kinds
        self._schedule: Schedule = config.schedule
        self._place = ProcessRank()  # the rank is asked for when first needed
        self._failures = FailureCounter()

        self._seconds = 0.0  # what layerscope cost the training thread, see cost_seconds
        # Which kinds the sentinel watches on the steps that are not recorded.
        self._sentinel_kinds = self._kinds & {Kind.ACTIVATION, Kind.GRAD}
        self._clock = StepClock(self._schedule, bool(self._sentinel_kinds), self._on_accelerator)
        self._closed = False
        self._identities = Identities()

        self._call_counts: dict[tuple[str, str], int] = {}
        self._checkpointed: dict[str, list[int]] = {}  # calls whose grads wait for recompute
        # Passes: a forward pass begins where the model is entered, at its root or, where
        # the root's forward never runs (Lightning's training_step), at a child of the root.
        self._entry_depth = 0
        self._entries: set[int] = set()  # ids of the root and its children
        self._pass_entries: set[int] = set()  # ids of the modules that entered this pass
        self._pass_ended = True  # a backward pass ended since the pass began
        # An optimizer step ended a step since the last scope.step(); one is under way.
        self._optimizer_ended = False
        self._optimizer_stepping = False
        self._backward_in_step = False  # a backward pass reached the probe in this step
        self._fp16_pass = False  # the training pass ran under fp16 autocast (GradScaler)
        self._calls: list[CallEvent] = []
        self._calls_step: int | None = None  # the step whose call order is recorded
        self._calls_open = True
        self._calls_sent = False
        self._grad_read_queued = False
        self._snapshots = [UpdateSnapshot() for _ in self._optimizers]
        self._positions: list[list[int]] = [[] for _ in self._optimizers]

        self._hooks = HookHandles()
        self._call_order_hooks = HookHandles()
        self._child_entry_hooks = HookHandles()
        targets = list(select(self._root, config.selection))
        if not targets:
            raise ValueError(
                f"no module selected: include={_patterns(config.selection.include)}, "
                f"exclude={_patterns(config.selection.exclude)}, types={config.selection.types}"
            )
        self._targets = [(Target(name, type(m).__name__), m) for name, m in targets]
        # Another open scope on the same modules would double every hook (a re-run cell).
        self._claims = ModuleClaims.claim([self._root, *(m for _, m in targets)], self)
        self._params = _owned(targets, lambda m: m.named_parameters(recurse=False))
        self._probe = _probe(self._root, self._optimizers)
        self._module_buffers = _owned(targets, lambda m: m.named_buffers(recurse=False))
        self._modules = module_tree(self._root, {name for name, _ in targets})

        # Without a store the records stay in memory, for frame().
        self._store = store
        self._memory: MemorySink | None = None
        main: Sink = store
        if store is None:
            main = self._memory = MemorySink()
        # The store starts last: a sink that fails to start then leaves no run directory
        # behind to block a retry at the same path.
        self._sink = FanOut([*sinks, main])
        self._started = time.time()
        try:
            self._sink.start(self._run_info(store))
        except BaseException:
            self._claims.release()
            raise
        self._pipeline = Pipeline(
            self._sink,
            place=self._place,
            selection=config.stats,
            identities=self._identities,
            failures=self._failures,
            flush_steps=getattr(store, "flush_steps", 10),
            flush_seconds=getattr(store, "flush_seconds", 5.0),
            queue_size=getattr(store, "queue_size", 256),
        )
        # A scope left open at exit is closed then, so the writer writes what it holds.
        atexit.register(self.close)
        self._recorder = Recorder(
            config.histogram, config.stats.custom, self._identities, self._pipeline, self._fail
        )
        self._recorder.open_steps = self._clock.open_steps
        try:
            self._register()
        except BaseException:
            self.close("failed")
            discard = getattr(store, "discard", None)
            if discard is not None:  # a watch() that failed leaves no run behind
                discard()
            raise

    # ---------------------------------------------------------------- public surface

    @property
    def current_step(self) -> int:
        """The step in progress: training forwards and backwards now are recorded under it."""
        return self._clock.step

    @property
    def cost_seconds(self) -> float:
        """Seconds layerscope has spent on the training thread so far.

        That is its hooks, its reading of parameters and the start of its flushes. Work on the
        writer thread is not counted here; on CUDA the hooks only launch kernels, so this is
        their host-side cost. ``run.json`` keeps the total as ``cost_seconds``, and the CPU time
        of the writer thread and of the store's file writes as ``writer_seconds``.
        """
        return self._seconds

    @property
    def failures(self) -> int:
        """How many times monitoring failed and was skipped (the first one also warned)."""
        return self._failures.count

    @property
    def modules(self) -> list[ModuleInfo]:
        """The module tree: every module's type, parameter shapes and counts, and children."""
        return list(self._modules)

    @property
    def calls(self) -> list[CallEvent]:
        """Enter and exit order of the watched modules' forwards in the first recorded step."""
        return list(self._calls)

    def step(self, **scalars: float | Tensor) -> None:
        """End the training step and record scalars such as ``loss=`` or ``lr=`` for it.

        With ``optimizer=`` the optimizer's step ends the training step instead: then this
        records the scalars for the step the optimizer just ended, and ends the step only if
        the optimizer did not step since the last call although the model trained (a step
        that GradScaler skipped): call it once per iteration, after the optimizer step.
        Scalar tensors are kept on their device until the next flush, so passing ``loss``
        costs no host sync.

        Example:
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
            if not self._optimizers:
                self._recorder.add_scalars(clock.step, scalars)
                self._finish_step()
                return
            if not self._optimizer_ended and clock.trained and not self._optimizer_stepping:
                self._finish_step(skipped=True)
            self._optimizer_ended = False
            self._recorder.add_scalars(clock.step if clock.ended is None else clock.ended, scalars)
        finally:
            self._seconds += time.perf_counter() - start

    def frame(self, table: str = "stats") -> pandas.DataFrame:
        """What was recorded, as a pandas DataFrame (needs ``layerscope[dataframe]``).

        Args:
            table: ``"stats"`` (one row per step, phase, rank, module, kind, tensor and call),
                ``"scalars"`` (step, name, value) or ``"calls"`` (seq, event, module, call).

        Returns:
            A new DataFrame; later steps do not change it.
        """
        pd = require("pandas", "dataframe")
        self._failures.warn_pending()
        if table not in ("stats", "scalars", "calls"):
            raise ValueError(f"table: expected 'stats', 'scalars' or 'calls', got {table!r}")
        if not self._closed:
            self._flush_so_far()
            self._pipeline.drain()
        if self._memory is None:
            return self._stored_frame(table)
        if table == "stats":
            columns = chunks_to_columns(self._memory.chunks)
            names = self._columns()
            rows = len(columns.get("step", []))
            missing = [None] * rows  # a column no chunk has: sentinel rows lack most
            frame = pd.DataFrame({name: columns.get(name, missing) for name in names})
            if "hist" in frame:
                frame["hist"] = [None if h is None else h.numpy() for h in columns["hist"]]
            return frame
        if table == "scalars":
            return pd.DataFrame(self._memory.scalars, columns=["step", "name", "value"])
        return pd.DataFrame(
            [(c.seq, c.event, c.module, c.call) for c in self._memory.calls],
            columns=["seq", "event", "module", "call"],
        )

    def _stored_frame(self, table: str) -> pandas.DataFrame:
        """This process's rows of a stored run, shaped as an in-memory run's."""
        pd = require("pandas", "dataframe")
        from layerscope.store import load

        names = {
            "stats": self._columns(),
            "scalars": ["step", "name", "value"],
            "calls": ["seq", "event", "module", "call"],
        }[table]
        try:
            run = load(self._store.path)
        except FileNotFoundError:  # nothing written yet: a rank's files come with its rows
            return pd.DataFrame(columns=names)
        stored: pandas.DataFrame = getattr(run, table)
        if "rank" in stored:  # other ranks of the job write to the same run
            stored = stored[stored["rank"] == self._place.rank].reset_index(drop=True)
        if table != "stats":
            stored = stored.drop(columns="rank", errors="ignore")
        return stored

    def flush(self) -> None:
        """Wait until what the steps so far recorded is written to the run and every sink.

        Call it between steps. Training never needs it: the writer thread keeps up on its own.
        It is for reading a run while it trains, and for timing the writer's share of the cost.
        """
        self._check_open("flush")
        self._flush_so_far()
        self._pipeline.drain()

    def _flush_so_far(self) -> None:
        """Send what is complete now: evaluation rows, scalars, the sentinel's readings.

        Training rows of the step in progress stay with the writer until the step ends, when
        they are merged with the rest of the step's.
        """
        recorder = self._recorder
        if recorder.readings or recorder.extremes or recorder.scalars:
            try:
                recorder.flush(final=False, evaluated=True)
            except Exception as error:
                self._fail("flushing", error)

    def close(self, status: str = "finished") -> None:
        """Remove every hook and finish recording; what the current step has so far is kept.

        Args:
            status: how the run ended, saved with it: ``"finished"`` or ``"failed"`` (leaving
                the ``with`` on an exception passes ``"failed"``).

        Safe to call twice. ``frame()`` still works afterwards.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self._recorder.has_pending():
                self._recorder.flush(final=True)
            self._send_calls()
        except Exception as error:
            self._fail("flushing the last step", error)
        finally:
            self._hooks.remove()
            self._call_order_hooks.remove()
            self._child_entry_hooks.remove()
            self._claims.release()
            self._params = []
            self._module_buffers = []
            self._probe = None
            for snapshot in self._snapshots:
                snapshot.release()
            self._checkpointed.clear()
            self._pipeline.close(partial(self._summary, status))
            self._failures.warn_pending()

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
        state = "closed" if self._closed else f"step {self._clock.step}"
        return f"<Scope {type(self._root).__name__}, {len(self._targets)} modules, {state}>"

    # ---------------------------------------------------------------- registration

    def _register(self) -> None:
        root = self._root
        entry = self._entry_gated(self._on_entry)
        leave = self._entry_gated(self._on_leave)
        self._hooks.add(root.register_forward_pre_hook(entry, prepend=True))
        # Children are entry points only until the root's forward is seen to run.
        children = {id(child): child for child in root.children()}
        self._entries = {id(root), *children}
        for child in children.values():
            self._child_entry_hooks.add(child.register_forward_pre_hook(entry, prepend=True))
        for target, module in self._targets:
            hooks = self._hooks if Kind.INPUT in self._kinds else self._call_order_hooks
            hooks.add(
                module.register_forward_pre_hook(
                    self._gated(partial(self._on_enter, target, module)), with_kwargs=True
                )
            )
            self._hooks.add(
                module.register_forward_hook(self._gated(partial(self._on_exit, target, module)))
            )
        # Registered last so that they run after every target's forward hook, also on errors.
        for child in children.values():
            self._child_entry_hooks.add(child.register_forward_hook(leave, always_call=True))
        self._hooks.add(root.register_forward_hook(leave, always_call=True))

        if self._probe is not None:
            self._hooks.add(
                self._probe.register_post_accumulate_grad_hook(self._on_probe_grad)  # type: ignore[no-untyped-call]  # untyped in torch
            )
        for index, optimizer in enumerate(self._optimizers):
            self._hooks.add(
                optimizer.register_step_pre_hook(partial(self._before_optimizer_step, index))
            )
            self._hooks.add(
                optimizer.register_step_post_hook(partial(self._after_optimizer_step, index))
            )
        if not self._optimizers and Kind.WEIGHT_GRAD in self._kinds:
            # Without an optimizer, gradients are read when backward ends: by the time
            # scope.step() runs, zero_grad() may have cleared them.
            for param, _ in self._params:
                if param.requires_grad:
                    self._hooks.add(
                        param.register_post_accumulate_grad_hook(self._on_grad_accumulated)  # type: ignore[no-untyped-call]  # untyped in torch
                    )

    def _gated(self, hook: Callable[..., None]) -> Callable[..., None]:
        """``hook`` behind a gate that torch.compile traces away on unrecorded steps.

        The gate reads Python bools that dynamo guards on, so a compiled model keeps one
        graph on unrecorded steps, where the sentinel watches only what runs eagerly; on
        recorded steps the hook runs eagerly as a graph break, and the statistics are exactly
        those of an eager run. The bools change only between passes, never within one.
        """
        # The disabling wrapper is made at the first compiled call: making it imports dynamo,
        # a second and 70 MB that a model never compiled should not pay.
        eager: list[Callable[..., None]] = []
        clock = self._clock

        def gate(*args: Any, **kwargs: Any) -> None:
            compiling = torch.compiler.is_compiling()
            # The sentinel stays out of compiled code: it would break the graph every step.
            # Under compile `not compiling` comes first: no guard on watching, no recompile.
            if clock.recording or (not compiling and clock.watching):
                if not compiling:  # the disabling wrapper would only cost time here
                    hook(*args, **kwargs)
                    return
                if not eager:
                    eager.append(torch.compiler.disable(hook))  # type: ignore[no-untyped-call]  # untyped in torch
                eager[0](*args, **kwargs)

        return gate

    def _entry_gated(self, hook: Callable[..., None]) -> Callable[..., None]:
        """An entry hook: always run eagerly, and in compiled code only on recorded steps.

        Entries end skipped steps and begin passes, which unrecorded steps need too; their
        cost is one call where the model is entered, not one per module.
        """
        eager: list[Callable[..., None]] = []
        clock = self._clock

        def gate(*args: Any, **kwargs: Any) -> None:
            if not torch.compiler.is_compiling():
                hook(*args, **kwargs)
            elif clock.recording:
                if not eager:
                    eager.append(torch.compiler.disable(hook))  # type: ignore[no-untyped-call]  # untyped in torch
                eager[0](*args, **kwargs)

        return gate

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
            self._seconds += time.perf_counter() - start

    def _on_leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if id(module) not in self._entries:
            return
        self._entry_depth = max(0, self._entry_depth - 1)

    def _begin_pass(self, module: nn.Module) -> None:
        """The model is entered at ``module``, the root or one of its children.

        At the root every entry is a pass. At children, a pass goes on while other children
        enter it (an encoder, then a decoder) and ends when one enters again or a backward
        pass has ended: then micro-batches and validation batches merge by call.
        """
        root = module is self._root
        if root and len(self._child_entry_hooks):
            self._child_entry_hooks.remove()  # the model is entered at its root
        training = module.training and torch.is_grad_enabled()
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
            self._end_skipped_step()
            self._fp16_pass = self._probe is not None and _fp16_autocast(self._probe)
        if self._clock.begin_pass(training) and self._recorder.readings:
            # The last step's evaluation is over: its rows are complete.
            try:
                self._recorder.flush(final=False, evaluated=True)
            except Exception as error:
                self._fail("flushing an evaluation", error)
        self._call_counts.clear()
        if self._calls:
            self._calls_open = False  # one pass is the call order

    def _end_skipped_step(self) -> None:
        """End a step whose optimizer step did not come (GradScaler skipped it).

        Seen where the next iteration's training pass begins: a backward reached the probe
        parameter in this step, no optimizer step followed, and ``zero_grad()`` has cleared
        the gradient since.
        """
        if (
            self._optimizers
            and self._backward_in_step
            and not self._optimizer_stepping
            and self._probe is not None
            and self._probe.grad is None
        ):
            self._finish_step(skipped=True)

    def _on_probe_grad(self, param: Tensor) -> None:
        """A backward pass reached the probe parameter: one call per backward pass."""
        if self._closed or torch.compiler.is_compiling():
            return
        self._backward_in_step = True
        self._pass_ended = True  # the next forward is a pass of its own
        if self._fp16_pass and self._clock.step_records and Kind.WEIGHT_GRAD in self._kinds:
            # Under fp16 autocast, GradScaler may skip the step and its gradients would go
            # unread: read them as backward leaves them (scaled); the optimizer step's reading,
            # unscaled, replaces this one when the step comes.
            self._on_grad_accumulated(param)

    # ---------------------------------------------------------------- forward and backward hooks

    def _phase(self) -> str:
        if self._entry_depth:
            return TRAIN if self._clock.training else EVAL
        return TRAIN if self._root.training and torch.is_grad_enabled() else EVAL

    def _on_enter(
        self, target: Target, watched: nn.Module, module: nn.Module, args: Any, kwargs: Any
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
                for name, tensor in _inputs(args, kwargs):
                    self._recorder.record(step, target, Kind.INPUT, name, call, phase, tensor)
        except Exception as error:
            self._fail(f"the input hook of {target.name!r}", error)
        finally:
            self._seconds += time.perf_counter() - start

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
            self._seconds += time.perf_counter() - start

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
        return hooked

    def _on_grad(self, target: Target, name: str, call: int, grad: Tensor | None) -> None:
        clock = self._clock
        if self._closed or not (clock.recording or clock.watching) or grad is None:
            return
        start = time.perf_counter()
        try:
            record = self._recorder.record if clock.recording else self._recorder.record_extremes
            record(clock.step, target, Kind.GRAD, name, call, TRAIN, grad)
        except Exception as error:
            self._fail(f"the gradient hook of {target.name!r}", error)
        finally:
            self._seconds += time.perf_counter() - start

    def _log_call(self, event: str, target: Target, call: int) -> None:
        if self._calls_step is None:
            self._calls_step = self._clock.step
        if self._calls_step == self._clock.step:
            self._calls.append(CallEvent(len(self._calls), event, target.name, call))

    # ---------------------------------------------------------------- parameters and buffers

    def _on_grad_accumulated(self, param: Tensor) -> None:
        if self._clock.step_records and not self._grad_read_queued and not self._closed:
            self._grad_read_queued = True
            queue_at_backward_end(self._on_backward_end)

    def _on_backward_end(self) -> None:
        # Queued at the first gradient, this runs before callbacks queued later in the pass,
        # such as DDP's, which writes the all-reduced gradients back when its last bucket is
        # done. Queued again from here, the read runs after all of them.
        queue_at_backward_end(self._read_grads_after_backward)

    def _read_grads_after_backward(self) -> None:
        self._grad_read_queued = False
        # Each backward pass overwrites the last: after the final micro-batch, the reading is
        # of the accumulated gradient.
        self._timed(self._read_owned, Kind.WEIGHT_GRAD)

    def _before_optimizer_step(
        self, index: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if self._closed:
            return None
        self._optimizer_stepping = True
        if not self._clock.step_records:
            return None
        positions = self._positions[index] = owned_by(
            self._optimizers, index, [param for param, _ in self._params]
        )
        # args[0] is the optimizer itself; the closure follows it or comes by keyword.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        self._timed(self._snapshot_for_update, index)
        if closure is None:
            self._timed(self._read_owned, Kind.WEIGHT_GRAD, positions)
            return None

        # The closure computes the gradients (LBFGS, Lightning): read them when it returns.
        def closure_then_read() -> Any:
            loss = closure()
            self._timed(self._read_owned, Kind.WEIGHT_GRAD, positions)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_read}
        return (args[0], closure_then_read, *args[2:]), kwargs

    def _after_optimizer_step(
        self, index: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> None:
        if self._closed:
            return
        start = time.perf_counter()
        try:
            self._optimizer_stepping = False
            if self._clock.step_records:
                self._record_updates(index)
            if index == 0:  # the first optimizer's step ends the training step
                self._optimizer_ended = True
                self._finish_step()
        finally:
            self._seconds += time.perf_counter() - start

    def _snapshot_for_update(self, index: int) -> None:
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
                for position, param, update in zip(positions, params, updates, strict=True):
                    owners = self._params[position][1]
                    self._record_owned(Kind.UPDATE, owners, update, shard_label(param))
        except Exception as error:
            self._fail("reading the updates", error)

    def _read_owned(self, kind: Kind, positions: Sequence[int] | None = None) -> None:
        if kind not in self._kinds:
            return
        owned = self._module_buffers if kind is Kind.BUFFER else self._params
        chosen = owned if positions is None else [owned[i] for i in positions]
        for tensor, owners in chosen:
            try:  # one tensor that cannot be read must not cost the others theirs
                value = tensor.grad if kind is Kind.WEIGHT_GRAD else tensor
                if value is not None:
                    self._record_owned(kind, owners, value)
            except Exception as error:
                owner = owners[0]
                self._fail(f"reading {kind.value} {owner.tensor!r} of {owner.module!r}", error)

    def _record_owned(
        self, kind: Kind, owners: Sequence[Owner], tensor: Tensor, shard: str | None = None
    ) -> None:
        first = owners[0]
        target = Target(first.module, first.module_type)
        self._recorder.record(
            self._clock.step,
            target,
            kind,
            first.tensor,
            0,
            TRAIN,
            tensor,
            also_owned_by=owners[1:],
            shard=shard,
        )

    # ---------------------------------------------------------------- steps and flushes

    def _finish_step(self, skipped: bool = False) -> None:
        """Read what a step ends with, then end it; a skipped step says so in the scalars."""
        clock = self._clock
        if clock.step_records:
            if skipped:  # what backward left, unless zero_grad() has cleared it already
                self._read_owned(Kind.WEIGHT_GRAD)
            self._read_owned(Kind.WEIGHT)
            self._read_owned(Kind.BUFFER)
        if skipped:
            self._recorder.add_scalars(clock.step, {"skipped": 1.0})
        self._end_step()

    def _end_step(self) -> None:
        recorder = self._recorder
        clock = self._clock
        pending = recorder.readings or recorder.partial
        if pending or (clock.step_records and recorder.has_pending()) or recorder.unrecorded_due():
            try:
                recorder.flush(final=True)
            except Exception as error:
                self._fail("flushing a step", error)
        if self._calls_step == clock.step:
            self._calls_open = False
            self._send_calls()
        if not self._calls_open:
            self._call_order_hooks.remove()
        clock.end_step()
        if not clock.step_records:
            for snapshot in self._snapshots:
                snapshot.release()  # kept only from one recorded step to the next
        self._backward_in_step = False
        self._optimizer_stepping = False
        self._pass_entries = set()  # the next forward begins a pass
        self._call_counts.clear()
        self._checkpointed.clear()
        self._failures.warn_pending()

    def _on_accelerator(self) -> bool:
        """Whether the model's parameters are on a GPU or another accelerator now."""
        first = next(self._root.parameters(), None)
        return first is not None and first.device.type != "cpu"

    def _send_calls(self) -> None:
        if self._calls and not self._calls_sent:
            self._calls_sent = True
            self._pipeline.submit(Records(calls=list(self._calls)))

    def _run_info(self, store: Any) -> RunInfo:
        name = getattr(store, "name", None) or f"run-{time.strftime('%Y%m%d-%H%M%S')}"
        return RunInfo(
            id=uuid.uuid4().hex,
            name=name,
            started=self._started,
            place=self._place,
            config=self.config.to_dict(),
            modules=self._modules,
            histogram_edges=self.config.histogram_edges(),
        )

    def _summary(
        self,
        status: str,
        recorded_rows: int,
        dropped_rows: int,
        dropped_scalars: int,
        writer_seconds: float,
    ) -> RunSummary:
        return RunSummary(
            status=status,
            ended=time.time(),
            steps=self._clock.step + self._clock.trained,  # an unfinished step counts
            recorded_rows=recorded_rows,
            dropped_rows=dropped_rows,
            dropped_scalars=dropped_scalars,
            failures=self._failures.count,
            cost_seconds=self._seconds,
            writer_seconds=writer_seconds,
        )

    def _columns(self) -> list[str]:
        names = [*KEY_COLUMNS, *META_COLUMNS]
        names += [n for n in self.config.stats.builtin if n != "hist" or self.config.histogram]
        names += list(self.config.stats.custom)
        return names

    def _timed(self, action: Callable[..., None], *args: Any) -> None:
        start = time.perf_counter()
        try:
            action(*args)
        finally:
            self._seconds += time.perf_counter() - start

    def _fail(self, where: str, error: BaseException) -> None:
        self._failures.record(where, error)
        self._failures.warn_pending()

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise RuntimeError(f"{action}: this scope is closed")


def _owned(
    targets: Sequence[tuple[str, nn.Module]],
    named: Callable[[nn.Module], Iterator[tuple[str, Tensor]]],
) -> list[tuple[Tensor, list[Owner]]]:
    """Unique tensors of the targets with every target that owns each (tied weights)."""
    owners: dict[int, tuple[Tensor, list[Owner]]] = {}
    for name, module in targets:
        for tensor_name, tensor in named(module):
            entry = owners.setdefault(id(tensor), (tensor, []))
            entry[1].append(Owner(name, type(module).__name__, tensor_name))
    return list(owners.values())


def _inputs(args: Any, kwargs: Any) -> Iterator[tuple[str, Tensor]]:
    yield from named_tensors(tuple(args), "in")
    for key, value in (kwargs or {}).items():
        yield from named_tensors(value, f"in.{key}")


def _patterns(patterns: Sequence[Any]) -> list[str]:
    return [pattern.pattern for pattern in patterns]


def _probe(root: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> Tensor | None:
    """A parameter whose gradient tells that a backward pass ran: one hook, one call a pass.

    The first trainable parameter of the model that the first optimizer steps (or of the
    model, without an optimizer); None if there is none.
    """
    trainable = [param for param in root.parameters() if param.requires_grad]
    if optimizers:
        stepped = {id(param) for group in optimizers[0].param_groups for param in group["params"]}
        trainable = [param for param in trainable if id(param) in stepped] or trainable
    return trainable[0] if trainable else None


def _fp16_autocast(param: Tensor) -> bool:
    """Whether fp16 autocast is on for ``param``'s device: the mixed precision of GradScaler."""
    device = param.device.type
    try:
        return bool(torch.is_autocast_enabled(device)) and (
            torch.get_autocast_dtype(device) == torch.float16
        )
    except (AttributeError, RuntimeError, TypeError):  # an older torch, an unknown device type
        return False
