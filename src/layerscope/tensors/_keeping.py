"""How a capture keeps one value: condition, ``stash`` or ``stash_value``, a copy or a fold.

``ValueKeeper`` is the part of ``Capture`` that turns a tensor a hook sees into a record:
``condition`` decides on the record, ``stash(event)`` or ``stash_value(tensor)`` maps the
tensor on its device, and the result is copied (compact, detached) or folded into a running
reduction, within ``max_bytes``. Weight gradients are read at the optimizer's moment
(``layerscope.hooks.GradientMoments``); each reading replaces the step's last one, and the
step's end keeps the last.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from layerscope._errors import FailureCounter, LayerscopeWarning
from layerscope.distributed import local_tensor
from layerscope.hooks import GradientMoments
from layerscope.model import Kind
from layerscope.tensors._event import Event
from layerscope.tensors._options import CaptureOptions
from layerscope.tensors._records import Record
from layerscope.tensors._recordset import RecordSet
from layerscope.tensors._reductions import Reduction
from layerscope.tensors._values import (
    detached,
    kept_value,
    map_tensors,
    value_bytes,
    value_size,
)

TRAIN = "train"


@dataclass(frozen=True, slots=True)
class Target:
    """A chosen module: its name, its class's name, and the module (weakly)."""

    name: str
    type: str
    module: weakref.ref[nn.Module]


class ValueKeeper(RecordSet):
    """Keeps values in records; ``Capture`` hooks the modules and calls ``_offer``."""

    # Whether a record may hold what is not a tensor (a run's whole tensors go to safetensors
    # parts and worker processes, which take tensors only).
    _any_value = True

    def __init__(self, options: CaptureOptions, targets: list[Target]) -> None:
        super().__init__()
        self._options = options
        self._lock = threading.Lock()
        self._failures = FailureCounter()
        self._step = 0
        self._reduced: dict[tuple[str, str, str], Record] = {}
        self._bytes = 0
        self._skipped = 0
        self._full = False  # max_bytes reached: no new value is kept until clear()
        self._full_warning_due = False
        self._closed = False
        # Weight gradients: each parameter of a chosen module under its owner, and the readings
        # of the step in progress, (module, parameter name) -> (record, value copied).
        self._grad_owners: list[tuple[Target, str]] = []
        params: list[Tensor] = []
        if Kind.WEIGHT_GRAD in options.kinds:
            for target in targets:
                module = target.module()
                for name, param in [] if module is None else module.named_parameters(recurse=False):
                    self._grad_owners.append((target, name))
                    params.append(param)
        self._grad_params = params
        self._grads_read: dict[tuple[str, str], tuple[Record, Any]] = {}
        self._moments: GradientMoments | None = None
        if params:
            self._moments = GradientMoments(params, options.optimizers, self._read_weight_grads)

    # ---------------------------------------------------------------- for the hooks

    def _keeps_value_of(self, step: int) -> bool:
        """Whether a pass of ``step`` is kept (here hooks are on only in such steps)."""
        return True

    def _offer(
        self,
        target: Target,
        kind: Kind,
        name: str,
        step: int,
        phase: str,
        call: int,
        tensor: Tensor,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        whole: bool = False,
    ) -> None:
        """Keep ``tensor`` (``whole``: an output) if the condition says so; failures counted."""
        try:
            prepared = self._prepare(
                target, kind, name, step, phase, call, tensor, args, kwargs, whole
            )
            if prepared is not None:
                with self._lock:
                    self._store(*prepared)
        except Exception as error:
            self._failures.record(f"keeping {kind.value} {name!r} of {target.name!r}", error)

    def _prepare(
        self,
        target: Target,
        kind: Kind,
        name: str,
        step: int,
        phase: str,
        call: int,
        tensor: Tensor,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        whole: bool = False,
    ) -> tuple[Record, Any] | None:
        """The record of ``tensor`` and what to keep of it, or None where ``condition`` says no.

        ``whole``: ``tensor`` is a module's whole output, a structure of tensors and more.
        """
        options = self._options
        with torch.no_grad():
            value: Any = detached(tensor) if whole else tensor.detach()
            record = Record(
                module=target.name,
                type=target.type,
                kind=kind.value,
                tensor=name,
                step=step,
                phase=phase,
                call=call,
                value=value,
                whole=whole,
            )
            if options.condition is not None and not options.condition(record):
                return None
            module = target.module()
            if options.stash is not None and module is not None:
                event = Event(
                    module=module, name=target.name, kind=kind.value, tensor=name, step=step,
                    phase=phase, call=call, value=value, args=args, kwargs=dict(kwargs or {}),
                )  # fmt: skip
                value = detached(options.stash(event))
            elif options.stash_value is not None:
                stash_value = options.stash_value
                value = detached(map_tensors(value, stash_value) if whole else stash_value(value))
            if not self._any_value and not isinstance(value, Tensor):
                raise TypeError(
                    f"stash_value: expected a function returning a Tensor, got "
                    f"{type(value).__name__}"
                )
            return record, value

    def _copy(self, value: Any) -> Any:
        """``value`` with each tensor in it copied where kept values go."""
        return kept_value(value, self._options.device)

    def _store(self, record: Record, value: Any, copied: bool = False) -> None:
        """Keep or fold ``value`` (``copied``: a copy made already). Under the lock."""
        if self._options.reduction is None:
            self._keep(record, value, copied)
        else:
            self._fold(self._options.reduction, record, value)

    def _room_for(self, size: int) -> bool:
        limit = self._options.max_bytes
        if not self._full and (limit is None or self._bytes + size <= limit):
            return True
        if not self._full:
            self._full = True
            self._full_warning_due = True
        self._skipped += 1
        return False

    def _keep(self, record: Record, value: Any, copied: bool = False) -> None:
        if not self._room_for(value_size(value)):
            return
        record.value = value if copied else self._copy(value)
        self._bytes += value_bytes(record.value)
        self._records.append(record)

    def _fold(self, reduction: Reduction, record: Record, value: Any) -> None:
        if not isinstance(value, Tensor):
            raise TypeError(
                f"reduction: folds tensors, and stash or stash_value returned a "
                f"{type(value).__name__}"
            )
        key = (record.module, record.kind, record.tensor)
        running = self._reduced.get(key)
        if running is None:
            size = value.numel() * reduction.accumulator_dtype(value.dtype).itemsize
            if not self._room_for(size):
                return
            record.value = reduction.start(value, self._options.device)
            self._bytes += value_bytes(record.value)
            self._reduced[key] = record
            self._records.append(record)
            return
        before = value_bytes(running.value)
        running.value = reduction.fold(
            running.value, value, running.count + 1, self._options.device
        )
        running.count += 1
        running.step, running.phase, running.call = record.step, record.phase, record.call
        self._bytes += value_bytes(running.value) - before

    # ---------------------------------------------------------------- weight gradients

    def _read_weight_grads(self, positions: list[int]) -> None:
        """The optimizer's moment: read the gradients, replacing the step's last readings."""
        step = self._step
        if self._closed or not self._keeps_value_of(step):
            return
        for position in positions:
            target, name = self._grad_owners[position]
            grad = self._grad_params[position].grad
            if grad is None:
                continue
            try:  # an FSDP2 gradient: this rank's shard, with no collective
                prepared = self._prepare(target, Kind.WEIGHT_GRAD, name, step, TRAIN, 0,
                                         local_tensor(grad))  # fmt: skip
                if prepared is not None:  # copied now: zero_grad() may clear it in place
                    record, value = prepared
                    self._grads_read[(target.name, name)] = (record, self._copy(value))
            except Exception as error:
                self._failures.record(f"keeping the gradient of {name!r} of {target.name!r}", error)
        self._warn_pending()

    def _keep_weight_grads(self) -> None:
        """The step ends: keep its last readings of the weight gradients."""
        moments = self._moments
        if moments is not None and moments.backward_pending and len(moments):
            # No optimizer stepped since backward (GradScaler skipped the step): what
            # backward left, unless zero_grad() has cleared it already.
            self._read_weight_grads(list(range(len(self._grad_params))))
            moments.backward_pending = False
        readings, self._grads_read = self._grads_read, {}
        with self._lock:
            for record, value in readings.values():
                try:
                    self._store(record, value, copied=True)
                except Exception as error:
                    self._failures.record(f"keeping the gradient of {record.module!r}", error)
        self._warn_pending()

    def _forget_weight_grads_of(self, module: str) -> None:
        """Read no more weight gradients of ``module``; those of the others go on."""
        kept = [i for i, (target, _) in enumerate(self._grad_owners) if target.name != module]
        self._grad_owners = [self._grad_owners[i] for i in kept]
        self._grad_params = [self._grad_params[i] for i in kept]
        self._grads_read = {key: read for key, read in self._grads_read.items() if key[0] != module}
        if self._moments is not None:
            self._moments.remove()  # its hooks come back with the others' at the next sync
            self._moments = None
            if self._grad_params:
                self._moments = GradientMoments(
                    self._grad_params, self._options.optimizers, self._read_weight_grads
                )

    def _release_weight_grads(self) -> None:
        if self._moments is not None:
            self._moments.remove()
        self._moments = None
        self._grad_params = []
        self._grads_read = {}

    # ---------------------------------------------------------------- warnings

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
