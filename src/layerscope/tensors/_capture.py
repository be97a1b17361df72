"""``Capture``: hooks that keep whole tensors of chosen modules, step by step.

A forward hook on each chosen module copies its outputs (and registers a tensor hook on each
output that needs a gradient, for the gradient with respect to it); a forward pre-hook copies
inputs. Tensor hooks, not full backward hooks: those break ``ReLU(inplace=True)``. Copies are
made inside the hook, before a later in-place op can change the tensor. Hooks are plain
closures, so ``copy.deepcopy`` of a model under capture (an EMA copy) copies no capture; the
copy's forward passes are not kept.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn

from layerscope._errors import FailureCounter, LayerscopeWarning
from layerscope.hooks import HookHandles, in_backward, named_tensors
from layerscope.model import Kind, select, unwrap
from layerscope.tensors._options import CaptureOptions
from layerscope.tensors._records import Record, kept_bytes, kept_copy
from layerscope.tensors._recordset import RecordSet
from layerscope.tensors._reductions import Reduction

TRAIN = "train"
EVAL = "eval"


@dataclass(frozen=True, slots=True)
class _Target:
    name: str
    type: str
    module: weakref.ref[nn.Module]


class Capture(RecordSet):
    """Whole tensors of chosen modules, kept while the capture is open.

    Made by ``layerscope.capture``; see there. A context manager: leaving the ``with`` block,
    or ``close()``, removes every hook, also when the block raised. The records stay.
    """

    def __init__(self, model: nn.Module, options: CaptureOptions) -> None:
        super().__init__()
        root = unwrap(model)
        targets = [
            _Target(name, type(module).__name__, weakref.ref(module))
            for name, module in select(root, options.selection)
        ]
        if not targets:
            raise ValueError(
                f"include/exclude/types: no module of the model is chosen "
                f"(include={options.to_dict()['include']}, "
                f"exclude={options.to_dict()['exclude']}, types={options.to_dict()['types']})"
            )
        self._options = options
        self._root: weakref.ref[nn.Module] | None = weakref.ref(root)
        self._targets: list[_Target] = targets
        self._handles = HookHandles()
        self._lock = threading.Lock()
        self._failures = FailureCounter()
        self._step = 0
        self._calls: dict[tuple[str, str, int], int] = {}  # (module, phase, step): calls
        self._reduced: dict[tuple[str, str, str], Record] = {}
        self._bytes = 0
        self._skipped = 0
        self._full = False  # max_bytes reached: no new value is kept until clear()
        self._full_warning_due = False
        self._closed = False
        self._sync_hooks()

    # ---------------------------------------------------------------- public

    @property
    def current_step(self) -> int:
        """The step that forward passes now belong to."""
        return self._step

    @property
    def bytes(self) -> int:
        """Bytes of memory the kept values hold."""
        return self._bytes

    @property
    def skipped(self) -> int:
        """Values not kept because ``max_bytes`` was reached (since the capture began)."""
        return self._skipped

    @property
    def failures(self) -> int:
        """Monitoring failures: the first warned once, all were counted, none stopped training."""
        return self._failures.count

    @property
    def hooks(self) -> int:
        """Hooks now on the model's modules (0 after close)."""
        return len(self._handles)

    @property
    def closed(self) -> bool:
        """Whether the capture was closed."""
        return self._closed

    def step(self) -> None:
        """End the step: later forward passes belong to the next one.

        With ``every=N`` only every N-th step keeps values; between them the modules carry no
        hook of the capture at all.
        """
        if self._closed:
            raise RuntimeError("capture: step() after close(); the capture is closed")
        self._step += 1
        self._calls.clear()
        self._sync_hooks()

    def close(self) -> None:
        """Remove every hook and let go of the model; the records stay. Safe to call twice."""
        self._closed = True
        self._handles.remove()
        self._targets = []
        self._root = None
        self._calls.clear()

    def clear(self) -> None:
        """Forget every record; ``max_bytes`` counts from zero again."""
        with self._lock:
            super().clear()
            self._reduced.clear()
            self._bytes = 0
            self._full = False

    def __enter__(self) -> Capture:
        if self._closed:
            raise RuntimeError("capture: a closed capture cannot be entered again")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self._step}"
        return (
            f"Capture({state}, records={len(self._records)}, bytes={self._bytes}, "
            f"hooks={self.hooks})"
        )

    def _info(self) -> dict[str, Any]:
        return {
            "options": self._options.to_dict(),
            "steps": self._step + 1,
            "bytes": self._bytes,
            "skipped": self._skipped,
            "failures": self._failures.count,
        }

    # ---------------------------------------------------------------- hooks

    def _records_step(self) -> bool:
        return self._step % self._options.every == 0

    def _keeps_value_of(self, step: int) -> bool:
        """Whether a pass of ``step`` is kept (here hooks are on only in such steps)."""
        return True

    def _hook_step(self) -> int:
        """The step a forward pass now belongs to."""
        return self._step

    def _sync_hooks(self) -> None:
        wanted = not self._closed and self._records_step()
        if wanted and not len(self._handles):
            self._attach()
        elif not wanted and len(self._handles):
            self._handles.remove()

    def _attach(self) -> None:
        for target in self._targets:
            module = target.module()
            if module is None:
                continue
            if Kind.INPUT in self._options.kinds:
                pre = module.register_forward_pre_hook(self._input_hook(target), with_kwargs=True)
                self._handles.add(pre)
            # Also for inputs alone: it counts the calls.
            self._handles.add(module.register_forward_hook(self._output_hook(target)))

    def _input_hook(self, target: _Target) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self._closed or module is not target.module() or in_backward():
                return
            step = self._hook_step()
            if not self._keeps_value_of(step):
                return
            phase = self._phase()
            call = self._calls.get((target.name, phase, step), 0)  # the output hook counts it
            tensors = [*named_tensors(tuple(args), "in")]
            for key, value in (kwargs or {}).items():
                tensors.extend(named_tensors(value, f"in.{key}"))
            for name, tensor in tensors:
                self._offer(target, Kind.INPUT, name, step, phase, call, tensor)
            self._warn_pending()

        return hook

    def _output_hook(self, target: _Target) -> Callable[..., None]:
        kinds = self._options.kinds

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            # A checkpointed forward recomputed in backward was kept the first time.
            if self._closed or module is not target.module() or in_backward():
                return
            step = self._hook_step()
            if not self._keeps_value_of(step):
                return
            phase = self._phase()
            key = (target.name, phase, step)
            call = self._calls.get(key, 0)
            self._calls[key] = call + 1
            for name, tensor in named_tensors(output, "out"):
                if Kind.ACTIVATION in kinds:
                    self._offer(target, Kind.ACTIVATION, name, step, phase, call, tensor)
                # A leaf (a parameter returned as it is) would keep the hook for good.
                if Kind.GRAD in kinds and tensor.requires_grad and not tensor.is_leaf:
                    try:
                        grad_hook = self._grad_hook(target, name, step, phase, call)
                        tensor.register_hook(grad_hook)  # type: ignore[no-untyped-call]  # untyped in torch
                    except Exception as error:
                        self._failures.record(f"hooking the gradient of {target.name!r}", error)
            self._warn_pending()

        return hook

    def _grad_hook(
        self, target: _Target, name: str, step: int, phase: str, call: int
    ) -> Callable[[Tensor], None]:
        def hook(grad: Tensor | None) -> None:
            # After close() a graph built before it may still run backward: keep nothing.
            if self._closed or grad is None:
                return
            self._offer(target, Kind.GRAD, name, step, phase, call, grad)
            self._warn_pending()

        return hook

    def _phase(self) -> str:
        root = None if self._root is None else self._root()
        training = root is None or root.training
        return TRAIN if training and torch.is_grad_enabled() else EVAL

    # ---------------------------------------------------------------- keeping values

    def _offer(
        self,
        target: _Target,
        kind: Kind,
        name: str,
        step: int,
        phase: str,
        call: int,
        tensor: Tensor,
    ) -> None:
        """Keep ``tensor`` if the condition says so; a failure is counted, never raised."""
        options = self._options
        try:
            with torch.no_grad():
                value = tensor.detach()
                record = Record(
                    module=target.name,
                    type=target.type,
                    kind=kind.value,
                    tensor=name,
                    step=step,
                    phase=phase,
                    call=call,
                    value=value,
                )
                if options.condition is not None and not options.condition(record):
                    return
                if options.stash_value is not None:
                    value = options.stash_value(value)
                    if not isinstance(value, Tensor):
                        raise TypeError(
                            f"stash_value: expected a function returning a Tensor, got "
                            f"{type(value).__name__}"
                        )
                    value = value.detach()
                with self._lock:
                    if options.reduction is None:
                        self._keep(record, value)
                    else:
                        self._fold(options.reduction, record, value)
        except Exception as error:
            self._failures.record(f"keeping {kind.value} {name!r} of {target.name!r}", error)

    def _room_for(self, size: int) -> bool:
        limit = self._options.max_bytes
        if not self._full and (limit is None or self._bytes + size <= limit):
            return True
        if not self._full:
            self._full = True
            self._full_warning_due = True
        self._skipped += 1
        return False

    def _keep(self, record: Record, value: Tensor) -> None:
        if not self._room_for(value.numel() * value.element_size()):
            return
        record.value = kept_copy(value, self._options.device)
        self._bytes += kept_bytes(record.value)
        self._records.append(record)

    def _fold(self, reduction: Reduction, record: Record, value: Tensor) -> None:
        key = (record.module, record.kind, record.tensor)
        running = self._reduced.get(key)
        if running is None:
            size = value.numel() * reduction.accumulator_dtype(value.dtype).itemsize
            if not self._room_for(size):
                return
            record.value = reduction.start(value, self._options.device)
            self._bytes += kept_bytes(record.value)
            self._reduced[key] = record
            self._records.append(record)
            return
        before = kept_bytes(running.value)
        running.value = reduction.fold(
            running.value, value, running.count + 1, self._options.device
        )
        running.count += 1
        running.step, running.phase, running.call = record.step, record.phase, record.call
        self._bytes += kept_bytes(running.value) - before

    def _warn_pending(self) -> None:
        """Warn once of the first failure and once when ``max_bytes`` is reached."""
        self._failures.warn_pending()
        if self._full_warning_due:
            self._full_warning_due = False
            warnings.warn(self._full_message(), LayerscopeWarning, stacklevel=3)

    def _full_message(self) -> str:
        return (
            f"layerscope: capture reached max_bytes={self._options.max_bytes}; later "
            f"values are not kept (capture.skipped counts them; clear() makes room)"
        )
