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
from layerscope._hooks import HookHandles, in_backward, queue_at_backward_end
from layerscope._imports import require
from layerscope._kinds import Kind
from layerscope._modules import CallEvent, ModuleInfo, module_tree
from layerscope._pipeline import Pipeline
from layerscope._ranks import ProcessRank
from layerscope._recorder import Owner, Recorder, Target
from layerscope._schedule import Schedule
from layerscope._select import select, unwrap
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
        optimizer: torch.optim.Optimizer | None,
        config: WatchConfig,
        sinks: Sequence[Sink] = (),
        store: Any = None,
    ) -> None:
        self.config = config
        self._root = unwrap(model)
        self._optimizer = optimizer
        self._kinds = config.kinds
        self._schedule: Schedule = config.schedule
        self._place = ProcessRank()  # the rank is asked for when first needed
        self._failures = FailureCounter()

        self._step = 0
        self._seconds = 0.0  # what layerscope cost the training thread, see cost_seconds
        # Which kinds the sentinel watches on the steps that are not recorded.
        self._sentinel_kinds = self._kinds & {Kind.ACTIVATION, Kind.GRAD}
        self._recording = False
        self._watching = False  # the step gets the sentinel
        self._closed = False
        self._identities = Identities()

        self._call_counts: dict[tuple[str, str], int] = {}
        self._checkpointed: dict[str, list[int]] = {}  # calls whose grads wait for recompute
        self._root_depth = 0
        self._root_phase = TRAIN
        self._calls: list[CallEvent] = []
        self._calls_step: int | None = None  # the step whose call order is recorded
        self._calls_open = True
        self._calls_sent = False
        self._grad_read_queued = False
        self._before_step = UpdateSnapshot()

        self._hooks = HookHandles()
        self._call_order_hooks = HookHandles()
        targets = list(select(self._root, config.selection))
        if not targets:
            raise ValueError(
                f"no module selected: include={_patterns(config.selection.include)}, "
                f"exclude={_patterns(config.selection.exclude)}, types={config.selection.types}"
            )
        self._targets = [(Target(name, type(m).__name__), m) for name, m in targets]
        self._params = _owned(targets, lambda m: m.named_parameters(recurse=False))
        self._set_step_mode()
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
        self._sink.start(self._run_info(store))
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
        try:
            self._register()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- public surface

    @property
    def current_step(self) -> int:
        """The step in progress: forwards and backwards now are recorded under it."""
        return self._step

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

        With ``optimizer=`` the optimizer's step ends the training step instead: then this only
        records the scalars, for the step the optimizer just ended. Scalar tensors are kept on
        their device until the next flush, so passing ``loss`` costs no host sync.

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
        if self._optimizer is None:
            self._recorder.add_scalars(self._step, scalars)
            if self._recording:
                self._read_after_step()
            self._end_step()
        else:
            self._recorder.add_scalars(max(self._step - 1, 0), scalars)
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
            self._pipeline.drain()
        if self._memory is None:
            from layerscope.store import load

            run = load(self._store.path)
            stored: pandas.DataFrame = getattr(run, table)
            return stored
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

    def flush(self) -> None:
        """Wait until what the steps so far recorded is written to the run and every sink.

        Call it between steps. Training never needs it: the writer thread keeps up on its own.
        It is for reading a run while it trains, and for timing the writer's share of the cost.
        """
        self._check_open("flush")
        recorder = self._recorder
        if not recorder.readings and (recorder.extremes or recorder.scalars):
            recorder.flush(final=True)  # the sentinel's rows and scalars of steps so far
        self._pipeline.drain()

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
            self._params = []
            self._module_buffers = []
            self._before_step.release()
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
        state = "closed" if self._closed else f"step {self._step}"
        return f"<Scope {type(self._root).__name__}, {len(self._targets)} modules, {state}>"

    # ---------------------------------------------------------------- registration

    def _register(self) -> None:
        root = self._root
        self._hooks.add(
            root.register_forward_pre_hook(self._gated(self._on_root_enter), prepend=True)
        )
        for target, module in self._targets:
            if Kind.INPUT in self._kinds:
                self._hooks.add(
                    module.register_forward_pre_hook(
                        self._gated(partial(self._on_enter, target)), with_kwargs=True
                    )
                )
            else:
                self._call_order_hooks.add(
                    module.register_forward_pre_hook(
                        self._gated(partial(self._on_enter, target)), with_kwargs=True
                    )
                )
            self._hooks.add(
                module.register_forward_hook(self._gated(partial(self._on_exit, target)))
            )
        # Registered last so that it runs after every target's forward hook, also on errors.
        self._hooks.add(
            root.register_forward_hook(self._gated(self._on_root_exit), always_call=True)
        )

        if self._optimizer is not None:
            self._hooks.add(self._optimizer.register_step_pre_hook(self._before_optimizer_step))
            self._hooks.add(self._optimizer.register_step_post_hook(self._after_optimizer_step))
        elif Kind.WEIGHT_GRAD in self._kinds:
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
        those of an eager run. The bools change only between steps, never within a forward.
        """
        # The disabling wrapper is made at the first compiled call: making it imports dynamo,
        # a second and 70 MB that a model never compiled should not pay.
        eager: list[Callable[..., None]] = []

        def gate(*args: Any, **kwargs: Any) -> None:
            compiling = torch.compiler.is_compiling()
            # The sentinel stays out of compiled code: it would break the graph every step.
            # Under compile `not compiling` comes first: no guard on _watching, no recompile.
            if self._recording or (not compiling and self._watching):
                if not compiling:  # the disabling wrapper would only cost time here
                    hook(*args, **kwargs)
                    return
                if not eager:
                    eager.append(torch.compiler.disable(hook))  # type: ignore[no-untyped-call]  # untyped in torch
                eager[0](*args, **kwargs)

        return gate

    # ---------------------------------------------------------------- forward and backward hooks

    def _phase(self) -> str:
        if self._root_depth:
            return self._root_phase
        return TRAIN if self._root.training and torch.is_grad_enabled() else EVAL

    def _on_root_enter(self, module: nn.Module, args: Any) -> None:
        if self._root_depth == 0:
            # The phase is decided where the model is entered: a reentrant checkpoint inside
            # runs under no_grad but is still training.
            self._root_phase = TRAIN if module.training and torch.is_grad_enabled() else EVAL
            if not in_backward():
                self._call_counts.clear()  # a new forward pass: micro-batches merge by call
        self._root_depth += 1

    def _on_root_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        self._root_depth = max(0, self._root_depth - 1)
        if self._root_depth == 0 and self._calls and self._calls_open:
            self._calls_open = False  # one forward pass is the call order; hooks go at step end

    def _on_enter(self, target: Target, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not self._recording or in_backward():
            return
        start = time.perf_counter()
        try:
            phase = self._phase()
            call = self._call_counts.get((target.name, phase), 0)
            if phase == TRAIN and self._calls_open:
                self._log_call("enter", target, call)
            if Kind.INPUT in self._kinds:
                for name, tensor in _inputs(args, kwargs):
                    self._recorder.record(self._step, target, Kind.INPUT, name, call, phase, tensor)
        except Exception as error:
            self._fail(f"the input hook of {target.name!r}", error)
        finally:
            self._seconds += time.perf_counter() - start

    def _on_exit(self, target: Target, module: nn.Module, args: Any, output: Any) -> None:
        if not (self._recording or self._watching):
            return
        start = time.perf_counter()
        try:
            if in_backward():
                self._on_recompute(target, output)
                return
            phase = self._phase()
            if not self._recording and phase != TRAIN:
                return  # the sentinel watches training, not evaluation
            key = (target.name, phase)
            call = self._call_counts.get(key, 0)
            self._call_counts[key] = call + 1
            if phase == TRAIN and self._calls_open and self._recording:
                self._log_call("exit", target, call)
            record = self._recorder.record if self._recording else self._recorder.record_extremes
            if Kind.ACTIVATION in self._kinds:
                for name, tensor in named_tensors(output, "out"):
                    try:  # one output that cannot be read must not cost the others theirs
                        record(self._step, target, Kind.ACTIVATION, name, call, phase, tensor)
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
        if self._closed or not (self._recording or self._watching) or grad is None:
            return
        start = time.perf_counter()
        try:
            record = self._recorder.record if self._recording else self._recorder.record_extremes
            record(self._step, target, Kind.GRAD, name, call, TRAIN, grad)
        except Exception as error:
            self._fail(f"the gradient hook of {target.name!r}", error)
        finally:
            self._seconds += time.perf_counter() - start

    def _log_call(self, event: str, target: Target, call: int) -> None:
        if self._calls_step is None:
            self._calls_step = self._step
        if self._calls_step == self._step:
            self._calls.append(CallEvent(len(self._calls), event, target.name, call))

    # ---------------------------------------------------------------- parameters and buffers

    def _on_grad_accumulated(self, param: Tensor) -> None:
        if self._recording and not self._grad_read_queued and not self._closed:
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
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if not self._recording or self._closed:
            return None
        # args[0] is the optimizer itself; the closure follows it or comes by keyword.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        self._timed(self._snapshot_for_update)
        if closure is None:
            self._timed(self._read_owned, Kind.WEIGHT_GRAD)
            return None

        # The closure computes the gradients (LBFGS, Lightning): read them when it returns.
        def closure_then_read() -> Any:
            loss = closure()
            self._timed(self._read_owned, Kind.WEIGHT_GRAD)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_read}
        return (args[0], closure_then_read, *args[2:]), kwargs

    def _after_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> None:
        if self._closed:
            return
        start = time.perf_counter()
        if self._recording:
            self._read_after_step()
        self._end_step()
        self._seconds += time.perf_counter() - start

    def _snapshot_for_update(self) -> None:
        if Kind.UPDATE in self._kinds:
            try:
                self._before_step.take([param for param, _ in self._params])
            except Exception as error:
                self._before_step.release()
                self._fail("copying the parameters before the step", error)

    def _read_after_step(self) -> None:
        self._read_owned(Kind.WEIGHT)
        self._read_owned(Kind.BUFFER)
        if Kind.UPDATE in self._kinds:
            try:
                updates = self._before_step.updates([param for param, _ in self._params])
                if updates is not None:
                    for (_, owners), update in zip(self._params, updates, strict=True):
                        self._record_owned(Kind.UPDATE, owners, update)
            except Exception as error:
                self._fail("reading the updates", error)

    def _read_owned(self, kind: Kind) -> None:
        if kind not in self._kinds:
            return
        owned = self._module_buffers if kind is Kind.BUFFER else self._params
        for tensor, owners in owned:
            try:  # one tensor that cannot be read must not cost the others theirs
                value = tensor.grad if kind is Kind.WEIGHT_GRAD else tensor
                if value is not None:
                    self._record_owned(kind, owners, value)
            except Exception as error:
                owner = owners[0]
                self._fail(f"reading {kind.value} {owner.tensor!r} of {owner.module!r}", error)

    def _record_owned(self, kind: Kind, owners: Sequence[Owner], tensor: Tensor) -> None:
        first = owners[0]
        target = Target(first.module, first.module_type)
        self._recorder.record(
            self._step, target, kind, first.tensor, 0, TRAIN, tensor, also_owned_by=owners[1:]
        )

    # ---------------------------------------------------------------- steps and flushes

    def _end_step(self) -> None:
        recorder = self._recorder
        if (self._recording and recorder.has_pending()) or recorder.unrecorded_due():
            try:
                recorder.flush(final=True)
            except Exception as error:
                self._fail("flushing a step", error)
        if self._calls_step == self._step:
            self._calls_open = False
            self._send_calls()
        if not self._calls_open:
            self._call_order_hooks.remove()
        self._step += 1
        self._set_step_mode()
        if not self._recording:
            self._before_step.release()  # kept only from one recorded step to the next
        self._call_counts.clear()
        self._checkpointed.clear()
        self._failures.warn_pending()

    def _set_step_mode(self) -> None:
        """Whether the new step is recorded, or watched by the sentinel."""
        schedule = self._schedule
        self._recording = schedule.records(self._step)
        # Where the model lives is asked only when the schedule leaves it to that.
        on_accelerator = schedule.sentinel is None and self._on_accelerator()
        self._watching = bool(self._sentinel_kinds) and schedule.sentinel_at(
            self._step, on_accelerator
        )

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
        self, status: str, recorded_rows: int, dropped_rows: int, writer_seconds: float
    ) -> RunSummary:
        return RunSummary(
            status=status,
            ended=time.time(),
            steps=self._step,
            recorded_rows=recorded_rows,
            dropped_rows=dropped_rows,
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

