"""``watch()`` and the ``Scope`` it returns: the lifecycle of recording a model.

The hot path is the hooks: each one checks a Python bool (is this step recorded?), computes
the partials of a tensor on its device and appends them to a device buffer. No hook reads a
value back to the host. At the end of a recorded step the buffers start their copy to the host
(one per device, non-blocking on CUDA) and the batch goes to the writer thread, which waits for
the copy, merges, finalises and hands the rows to the sinks.
"""

from __future__ import annotations

import atexit
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from layerscope._buffer import DeviceRows
from layerscope._config import WatchConfig, check_model
from layerscope._errors import FailureCounter
from layerscope._hooks import HookHandles, in_backward, queue_at_backward_end
from layerscope._imports import require
from layerscope._kinds import DEFAULT_CAPTURE, STATE_KINDS, Kind
from layerscope._modules import CallEvent, ModuleInfo, module_tree
from layerscope._pipeline import Pipeline
from layerscope._schedule import Schedule
from layerscope._select import select, unwrap
from layerscope._table import (
    KEY_COLUMNS,
    META_COLUMNS,
    Batch,
    Form,
    Identities,
    Identity,
    Reading,
    chunks_to_columns,
)
from layerscope._tree import named_tensors
from layerscope.sinks._base import FanOut, Records, RunInfo, RunSummary, Sink
from layerscope.sinks._memory import MemorySink
from layerscope.stats import tensor_partials

if TYPE_CHECKING:
    import pandas

TRAIN = "train"
EVAL = "eval"

# A step with many forward passes (long evaluations, much gradient accumulation) flushes when
# this many readings wait, so that device memory stays bounded; the host merges the pieces.
ROWS_PER_FLUSH = 4096
# Scalars of unrecorded steps wait for the next recorded one, or until this many wait.
SCALARS_PER_FLUSH = 512


def _eager(hook: Callable[..., None]) -> Callable[..., None]:
    """Run ``hook`` eagerly, also inside a compiled model.

    Under torch.compile each hook is then a graph break, and the statistics are exactly those
    of an eager run.
    """
    disabled: Callable[..., None] = torch.compiler.disable(hook)  # type: ignore[no-untyped-call]  # untyped in torch
    return disabled


@dataclass(frozen=True, slots=True)
class _Target:
    """A watched module."""

    name: str
    module_type: str


@dataclass(frozen=True, slots=True)
class _Owner:
    """A watched module owning a parameter or buffer as ``tensor``; tied ones have several."""

    module: str
    module_type: str
    tensor: str


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
        self._histogram = config.histogram
        self._custom = config.stats.custom
        self._schedule: Schedule = config.schedule
        self._rank = _rank()
        self._failures = FailureCounter()

        self._step = 0
        self._recording = self._schedule.records(0)
        self._closed = False
        self._buffers: dict[torch.device, tuple[int, DeviceRows]] = {}
        self._readings: list[Reading] = []
        self._identities = Identities()
        self._scalars: list[tuple[int, str, float | tuple[int, int]]] = []
        self._rows_per_flush = ROWS_PER_FLUSH
        self._partial = False  # the current step has flushed part of its readings
        self._last_flush = time.monotonic()

        self._call_counts: dict[tuple[str, str], int] = {}
        self._checkpointed: dict[str, list[int]] = {}  # calls whose grads wait for recompute
        self._root_depth = 0
        self._root_phase = TRAIN
        self._calls: list[CallEvent] = []
        self._calls_step: int | None = None  # the step whose call order is recorded
        self._calls_open = True
        self._calls_sent = False
        self._grad_read_queued = False
        self._before_step: dict[int, Tensor] = {}

        self._hooks = HookHandles()
        self._call_order_hooks = HookHandles()
        targets = list(select(self._root, config.selection))
        if not targets:
            raise ValueError(
                f"no module selected: include={_patterns(config.selection.include)}, "
                f"exclude={_patterns(config.selection.exclude)}, types={config.selection.types}"
            )
        self._targets = [(_Target(name, type(m).__name__), m) for name, m in targets]
        self._params = _owned(targets, lambda m: m.named_parameters(recurse=False))
        self._module_buffers = _owned(targets, lambda m: m.named_buffers(recurse=False))
        self._modules = module_tree(self._root, {name for name, _ in targets})

        # Without a store the records stay in memory, for frame().
        self._store = store
        self._memory: MemorySink | None = None
        main: Sink = store
        if store is None:
            main = self._memory = MemorySink()
        self._sink = FanOut([main, *sinks])
        self._started = time.time()
        self._sink.start(self._run_info(store))
        self._pipeline = Pipeline(
            self._sink,
            rank=self._rank,
            selection=config.stats,
            identities=self._identities,
            failures=self._failures,
            flush_steps=getattr(store, "flush_steps", 10),
            flush_seconds=getattr(store, "flush_seconds", 5.0),
            queue_size=getattr(store, "queue_size", 256),
        )
        # A scope left open at exit is closed then, so the writer writes what it holds.
        atexit.register(self.close)
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
        if self._optimizer is None:
            self._add_scalars(self._step, scalars)
            if self._recording:
                self._read_after_step()
            self._end_step()
        else:
            self._add_scalars(max(self._step - 1, 0), scalars)

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
            frame = pd.DataFrame({name: columns.get(name, []) for name in names})
            if "hist" in frame:
                frame["hist"] = [None if h is None else h.numpy() for h in columns["hist"]]
            return frame
        if table == "scalars":
            return pd.DataFrame(self._memory.scalars, columns=["step", "name", "value"])
        return pd.DataFrame(
            [(c.seq, c.event, c.module, c.call) for c in self._memory.calls],
            columns=["seq", "event", "module", "call"],
        )

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
            if self._readings or self._scalars or self._partial:
                self._flush(final=True)
            self._send_calls()
        finally:
            self._hooks.remove()
            self._call_order_hooks.remove()
            self._params = []
            self._module_buffers = []
            self._before_step.clear()
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
        self._hooks.add(root.register_forward_pre_hook(_eager(self._on_root_enter), prepend=True))
        for target, module in self._targets:
            if Kind.INPUT in self._kinds:
                self._hooks.add(
                    module.register_forward_pre_hook(
                        _eager(partial(self._on_enter, target)), with_kwargs=True
                    )
                )
            else:
                self._call_order_hooks.add(
                    module.register_forward_pre_hook(
                        _eager(partial(self._on_enter, target)), with_kwargs=True
                    )
                )
            self._hooks.add(module.register_forward_hook(_eager(partial(self._on_exit, target))))
        # Registered last so that it runs after every target's forward hook, also on errors.
        self._hooks.add(root.register_forward_hook(_eager(self._on_root_exit), always_call=True))

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
            if self._recording and not in_backward():
                self._call_counts.clear()  # a new forward pass: micro-batches merge by call
        self._root_depth += 1

    def _on_root_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        self._root_depth = max(0, self._root_depth - 1)
        if self._root_depth == 0 and self._calls and self._calls_open:
            self._calls_open = False  # one forward pass is the call order; hooks go at step end

    def _on_enter(self, target: _Target, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not self._recording or in_backward():
            return
        try:
            phase = self._phase()
            call = self._call_counts.get((target.name, phase), 0)
            if phase == TRAIN and self._calls_open:
                self._log_call("enter", target, call)
            if Kind.INPUT in self._kinds:
                for name, tensor in _inputs(args, kwargs):
                    self._record(target, Kind.INPUT, name, call, phase, tensor)
        except Exception as error:
            self._fail(f"the input hook of {target.name!r}", error)

    def _on_exit(self, target: _Target, module: nn.Module, args: Any, output: Any) -> None:
        if not self._recording:
            return
        try:
            if in_backward():
                self._on_recompute(target, output)
                return
            phase = self._phase()
            key = (target.name, phase)
            call = self._call_counts.get(key, 0)
            self._call_counts[key] = call + 1
            if phase == TRAIN and self._calls_open:
                self._log_call("exit", target, call)
            if Kind.ACTIVATION in self._kinds:
                for name, tensor in named_tensors(output, "out"):
                    self._record(target, Kind.ACTIVATION, name, call, phase, tensor)
            if Kind.GRAD in self._kinds and phase == TRAIN:
                hooked = self._hook_grads(target, call, output)
                if not hooked and not torch.is_grad_enabled():
                    # Inside a reentrant checkpoint: the output joins the graph when the
                    # forward is recomputed during backward, and is hooked then.
                    self._checkpointed.setdefault(target.name, []).append(call)
        except Exception as error:
            self._fail(f"the forward hook of {target.name!r}", error)

    def _on_recompute(self, target: _Target, output: Any) -> None:
        """A checkpointed forward runs again during backward.

        Its statistics are already recorded; only outputs that missed their gradient hook the
        first time (inside a reentrant checkpoint, under no_grad) get it now.
        """
        pending = self._checkpointed.get(target.name)
        if Kind.GRAD in self._kinds and pending:
            # Segments recompute last first, so the latest unhooked call is the one running.
            self._hook_grads(target, pending.pop(), output)

    def _hook_grads(self, target: _Target, call: int, output: Any) -> bool:
        hooked = False
        for name, tensor in named_tensors(output, "out"):
            if tensor.requires_grad:
                tensor.register_hook(partial(self._on_grad, target, name, call))  # type: ignore[no-untyped-call]  # untyped in torch
                hooked = True
        return hooked

    def _on_grad(self, target: _Target, name: str, call: int, grad: Tensor | None) -> None:
        if self._closed or not self._recording or grad is None:
            return
        try:
            self._record(target, Kind.GRAD, name, call, TRAIN, grad)
        except Exception as error:
            self._fail(f"the gradient hook of {target.name!r}", error)

    def _log_call(self, event: str, target: _Target, call: int) -> None:
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
        self._grad_read_queued = False
        # Each backward pass overwrites the last: after the final micro-batch, the reading is
        # of the accumulated gradient.
        self._read_owned(Kind.WEIGHT_GRAD)

    def _before_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if not self._recording or self._closed:
            return None
        # args[0] is the optimizer itself; the closure follows it or comes by keyword.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        self._snapshot_for_update()
        if closure is None:
            self._read_owned(Kind.WEIGHT_GRAD)
            return None

        # The closure computes the gradients (LBFGS, Lightning): read them when it returns.
        def closure_then_read() -> Any:
            loss = closure()
            self._read_owned(Kind.WEIGHT_GRAD)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_read}
        return (args[0], closure_then_read, *args[2:]), kwargs

    def _after_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> None:
        if self._closed:
            return
        if self._recording:
            self._read_after_step()
        self._end_step()

    def _snapshot_for_update(self) -> None:
        if Kind.UPDATE in self._kinds:
            self._before_step = {id(p): p.detach().clone() for p, _ in self._params}

    def _read_after_step(self) -> None:
        self._read_owned(Kind.WEIGHT)
        self._read_owned(Kind.BUFFER)
        if Kind.UPDATE in self._kinds and self._before_step:
            with torch.no_grad():
                for param, owners in self._params:
                    before = self._before_step.get(id(param))
                    if before is not None:
                        self._record_owned(Kind.UPDATE, owners, param.detach() - before)
            self._before_step = {}

    def _read_owned(self, kind: Kind) -> None:
        if kind not in self._kinds:
            return
        owned = self._module_buffers if kind is Kind.BUFFER else self._params
        try:
            for tensor, owners in owned:
                value = tensor.grad if kind is Kind.WEIGHT_GRAD else tensor
                if value is not None:
                    self._record_owned(kind, owners, value)
        except Exception as error:
            self._fail(f"reading {kind.value}", error)

    def _record_owned(self, kind: Kind, owners: Sequence[_Owner], tensor: Tensor) -> None:
        first = owners[0]
        target = _Target(first.module, first.module_type)
        self._record(target, kind, first.tensor, 0, TRAIN, tensor, also_owned_by=owners[1:])

    # ---------------------------------------------------------------- recording and flushing

    def _record(
        self,
        target: _Target,
        kind: Kind,
        name: str,
        call: int,
        phase: str,
        tensor: Tensor,
        also_owned_by: Sequence[_Owner] = (),
    ) -> None:
        row, hist = tensor_partials(tensor, self._histogram)
        buffer_id, rows = self._rows_on(tensor.device)
        index = rows.append(row, hist)
        custom = self._custom_stats(rows, tensor) if self._custom else ()
        identity = Identity(phase, target.name, target.module_type, kind, name, call)
        form = Form(_dtype_name(tensor.dtype), tuple(tensor.shape))
        reading = Reading(
            self._step,
            self._identities.code(identity),
            self._identities.form_code(form),
            buffer_id,
            index,
            kind in STATE_KINDS,
            custom,
        )
        self._readings.append(reading)
        for owner in also_owned_by:  # tied: computed once, reported under every owner
            alias = identity._replace(
                module=owner.module, module_type=owner.module_type, tensor=owner.tensor
            )
            self._readings.append(reading._replace(identity=self._identities.code(alias)))
        if len(self._readings) >= self._rows_per_flush:
            self._flush(final=False)

    def _custom_stats(
        self, rows: DeviceRows, tensor: Tensor
    ) -> tuple[tuple[str, int, int, bool, int], ...]:
        if not tensor.is_floating_point():
            return ()
        out = []
        with torch.no_grad():
            for name, fn in self._custom.items():
                try:
                    value = fn(tensor.detach())
                    if not isinstance(value, Tensor):
                        value = torch.tensor(float(value), dtype=torch.float64)
                    if value.dim() > 1:
                        raise ValueError(
                            f"returned shape {tuple(value.shape)}, expected 0-d or 1-D"
                        )
                    offset, length = rows.add_values(value)
                    out.append((name, offset, length, value.dim() == 0, tensor.numel()))
                except Exception as error:
                    self._fail(f"custom statistic {name!r}", error)
        return tuple(out)

    def _rows_on(self, device: torch.device) -> tuple[int, DeviceRows]:
        entry = self._buffers.get(device)
        if entry is None:
            slots = self._histogram.slots if self._histogram is not None else 0
            entry = (len(self._buffers), DeviceRows(device, slots))
            self._buffers[device] = entry
        return entry

    def _add_scalars(self, step: int, scalars: dict[str, float | Tensor]) -> None:
        for name, value in scalars.items():
            if isinstance(value, Tensor):
                if value.numel() != 1:
                    raise ValueError(
                        f"step: scalar {name!r} must have one element, got shape "
                        f"{tuple(value.shape)}"
                    )
                buffer_id, rows = self._rows_on(value.device)
                offset, _ = rows.add_values(value)
                self._scalars.append((step, name, (buffer_id, offset)))
            elif isinstance(value, int | float):
                self._scalars.append((step, name, float(value)))
            else:
                raise TypeError(
                    f"step: scalar {name!r} must be a number or a one-element tensor, "
                    f"got {type(value).__name__}"
                )

    def _end_step(self) -> None:
        scalars_due = len(self._scalars) >= SCALARS_PER_FLUSH or (
            self._scalars and time.monotonic() - self._last_flush >= 1.0
        )
        if (self._recording and (self._readings or self._scalars or self._partial)) or scalars_due:
            self._flush(final=True)
        if self._calls_step == self._step:
            self._calls_open = False
            self._send_calls()
        if not self._calls_open:
            self._call_order_hooks.remove()
        self._step += 1
        self._recording = self._schedule.records(self._step)
        self._call_counts.clear()
        self._checkpointed.clear()
        self._failures.warn_pending()

    def _flush(self, final: bool) -> None:
        """Start the copy of what the buffers hold to the host; ``final`` ends a step."""
        copies = {
            buffer_id: rows.take()
            for buffer_id, rows in self._buffers.values()
            if rows.has_content()
        }
        self._pipeline.submit(Batch(self._readings, copies, self._scalars, final))
        self._readings, self._scalars = [], []
        self._partial = not final
        self._last_flush = time.monotonic()

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
            rank=self._rank,
            config=self.config.to_dict(),
            modules=self._modules,
            histogram_edges=self.config.histogram_edges(),
        )

    def _summary(self, status: str, recorded_rows: int, dropped_rows: int) -> RunSummary:
        return RunSummary(
            status=status,
            ended=time.time(),
            steps=self._step,
            recorded_rows=recorded_rows,
            dropped_rows=dropped_rows,
            failures=self._failures.count,
        )

    def _columns(self) -> list[str]:
        names = [*KEY_COLUMNS, *META_COLUMNS]
        names += [n for n in self.config.stats.builtin if n != "hist" or self._histogram]
        names += list(self._custom)
        return names

    def _fail(self, where: str, error: BaseException) -> None:
        self._failures.record(where, error)
        self._failures.warn_pending()

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise RuntimeError(f"{action}: this scope is closed")


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    run: object = None,
    every: int | Schedule | None = None,
    capture: Sequence[str | Kind] = DEFAULT_CAPTURE,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    types: tuple[type[nn.Module], ...] | None = None,
    stats: object = None,
    histogram: object = "log2",
    alerts: bool = True,
    sinks: Sequence[Sink] = (),
) -> Scope:
    """Record statistics of every layer of ``model`` while it trains.

    Args:
        model: any ``nn.Module``; DDP and ``torch.compile`` wrappers are looked through for
            names. Hooks must be attached before a compiled model's first call.
        optimizer: if given, ``optimizer.step()`` ends each step; gradients are read just
            before it (after accumulation and unscaling), weights and updates just after.
        run: the run's directory (a path or an fsspec URL such as ``memory://runs/a``), or a
            ``layerscope.store.ParquetStore`` for its flush settings; None keeps the run in
            memory. An existing run is never overwritten: that raises FileExistsError.
        every: which steps get full statistics: an int N (every N-th step), a ``Schedule``, or
            None for the default ``Schedule(every=50, dense=10)``.
        capture: kinds to record: ``activation``, ``grad``, ``weight``, ``weight_grad`` by
            default; also ``input``, ``update`` (needs ``optimizer``) and ``buffer``.
        include: regex (or list of them) searched in qualified module names; a pattern that
            matches a whole name picks that module even if it is a container or a block
            without parameters of its own (``"^$"`` is the root).
        exclude: regex (or list) of module names to leave out.
        types: module classes to keep.
        stats: None for every built-in statistic; a list of names to keep some; a dict
            ``{name: fn}`` to add custom ones, ``fn(tensor)`` returning a scalar or a 1-D
            tensor (merged by numel-weighted mean); or a list of names and a dict.
        histogram: ``"log2"`` (range-free magnitude bins), ``("linear", lo, hi, bins)`` or None.
        alerts: health rules; none ship in this version, so only ``True`` and ``False`` are
            accepted and nothing is checked yet.
        sinks: extra outputs, e.g. ``layerscope.sinks.TensorBoard("tb/")``.

    Returns:
        A ``Scope``: a context manager whose exit removes every hook.

    Raises:
        TypeError: ``model`` is not a module, or an argument has the wrong type.
        ValueError: a bad regex, an unknown statistic or kind, ``every <= 0``, ``update``
            without an optimizer, or a selection that matches no module.

    Example:
        >>> import torch, layerscope
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> with layerscope.watch(model, every=1) as scope:
        ...     model(torch.randn(16, 4)).pow(2).mean().backward()
        ...     scope.step()
        >>> frame = scope.frame()
        >>> sorted(set(zip(frame.module, frame.kind)))[:4]
        [('0', 'activation'), ('0', 'grad'), ('0', 'weight'), ('0', 'weight_grad')]
    """
    model = check_model(model)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    checked_sinks = _check_sinks(sinks)
    if not isinstance(alerts, bool):
        raise ValueError(f"alerts: expected True or False in this version, got {alerts!r}")
    config = WatchConfig.from_arguments(
        has_optimizer=optimizer is not None,
        every=every,
        capture=capture,
        include=include,
        exclude=exclude,
        types=types,
        stats=stats,
        histogram=histogram,
    )
    store = None
    if run is not None:
        from layerscope.store import ParquetStore

        store = run if isinstance(run, ParquetStore) else ParquetStore(run)  # type: ignore[arg-type]  # ParquetStore checks the type
    return Scope(model, optimizer, config, sinks=checked_sinks, store=store)


def _check_sinks(sinks: object) -> list[Sink]:
    if isinstance(sinks, Sink):
        sinks = [sinks]
    if not isinstance(sinks, Sequence | tuple):
        raise TypeError(f"sinks: expected a list of sinks, got {type(sinks).__name__}")
    for sink in sinks:
        if not isinstance(sink, Sink):
            raise TypeError(
                f"sinks: {sink!r} is not a sink: it needs start, write, flush and close methods"
            )
    return list(sinks)


def _owned(
    targets: Sequence[tuple[str, nn.Module]],
    named: Callable[[nn.Module], Iterator[tuple[str, Tensor]]],
) -> list[tuple[Tensor, list[_Owner]]]:
    """Unique tensors of the targets with every target that owns each (tied weights)."""
    owners: dict[int, tuple[Tensor, list[_Owner]]] = {}
    for name, module in targets:
        for tensor_name, tensor in named(module):
            entry = owners.setdefault(id(tensor), (tensor, []))
            entry[1].append(_Owner(name, type(module).__name__, tensor_name))
    return list(owners.values())


def _inputs(args: Any, kwargs: Any) -> Iterator[tuple[str, Tensor]]:
    yield from named_tensors(tuple(args), "in")
    for key, value in (kwargs or {}).items():
        yield from named_tensors(value, f"in.{key}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _patterns(patterns: Sequence[Any]) -> list[str]:
    return [pattern.pattern for pattern in patterns]


def _rank() -> int:
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    return 0
