"""Whole tensors inside ``watch``: a capture whose steps are the scope's.

``RunTensors`` is a ``Capture`` driven by the scope's step clock: its hooks are on the modules
only in the steps that keep tensors (``tensors=``'s ``every``, or the steps that record
statistics), records carry the scope's step numbers, and values stay on their device (a copy
made in the hook, before an in-place op can change the tensor) until the step ends. Then the
step's records, and the chosen modules' own parameters if asked, go to the ``TensorOutlet``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from layerscope._errors import FailureCounter
from layerscope.distributed import local_tensor
from layerscope.model import Kind
from layerscope.tensors._capture import Capture
from layerscope.tensors._outlet import TensorOutlet, to_host
from layerscope.tensors._records import Record, kept_copy
from layerscope.tensors._spec import KeptSteps, TensorsSpec


class RunTensors(Capture):
    """The whole tensors a watched run keeps; see ``watch(tensors=...)``.

    Its values are tensors only (``stash_value`` must return one): they go to the run's
    safetensors parts and to ``on_tensor``'s worker processes.

    Args:
        model: the watched model.
        spec: what to keep (``tensors=``, checked).
        outlet: where each step's records go.
        step_now: the step a forward pass now belongs to (the scope's clock).
        training_now: whether the pass in progress is a training pass (the scope's clock: a
            checkpointed forward under ``no_grad`` is still training).
        records_statistics: whether a step records statistics (the scope's schedule).
        first_step: the scope's first step.
        failures: the scope's counter of monitoring failures.
        clock: seconds for ``every_seconds`` (``time.monotonic`` by default).
    """

    _any_value = False

    def __init__(
        self,
        model: nn.Module,
        spec: TensorsSpec,
        outlet: TensorOutlet,
        step_now: Callable[[], int],
        training_now: Callable[[], bool],
        records_statistics: Callable[[int], bool],
        first_step: int,
        failures: FailureCounter,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._spec = spec
        self._kept_steps = KeptSteps(spec, records_statistics, clock)
        self._outlet = outlet
        self._step_now = step_now
        self._training_now = training_now
        self._ended: int | None = None  # the last step that ended: its evaluation may come
        self._records_statistics = records_statistics
        self._pending: list[Record] = []
        self._parameters: list[tuple[str, str, weakref.ref[nn.Module]]] = []
        self._started = False  # no step is asked about before the first one is set
        try:
            super().__init__(model, spec.options)
        except ValueError as error:
            raise ValueError(f"tensors: {error}") from None
        self._step = first_step
        self._started = True
        self._failures = failures  # the scope's: one count of what monitoring skipped
        for target in self._targets:
            self._parameters.append((target.name, target.type, target.module))
        self._sync_hooks()

    # ---------------------------------------------------------------- the scope's side

    def end_step(self, ended: int, next_step: int) -> None:
        """Step ``ended`` ended: hand its records over, and hook the next step or not."""
        if self._closed:
            return
        try:
            self._keep_weight_grads()
            if self._spec.weights and self._keeps(ended):
                self._keep_weights(ended)
        finally:
            with self._lock:
                records, self._pending = self._pending, []
            self._step, self._ended = next_step, ended
            self._kept_steps.forget_before(ended)
            self._calls.clear()
            self._sync_hooks()
        if records:
            try:
                self._outlet.put(to_host(records))
            except Exception as error:
                self._failures.record("copying whole tensors to the host", error)
                self._outlet.count_dropped(len(records))
        self._outlet.warn_pending()

    def finish(self) -> None:
        """The scope closes: hand over what the step in progress kept, remove every hook."""
        if not self._closed:
            self._keep_weight_grads()
        with self._lock:
            records, self._pending = self._pending, []
        self.close()
        if records:
            self._outlet.put(to_host(records))

    # ---------------------------------------------------------------- Capture's hooks

    def _records_step(self) -> bool:
        # Also while the step that just ended keeps: its evaluation comes before the next pass.
        ended = self._ended
        if not self._started:
            return False
        return self._keeps(self._step) or (ended is not None and self._keeps(ended))

    def _phase(self) -> str:
        return "train" if self._training_now() else "eval"

    def _keeps_value_of(self, step: int) -> bool:
        return self._keeps(step)  # hooks stay on through the step after a kept one

    def _hook_step(self) -> int:
        return self._step_now()

    def _attach(self) -> None:
        if self._options.kinds:  # weights alone need no hook: they are read at step end
            super()._attach()

    def _copy(self, value: Any) -> Any:
        # A copy on the value's own device: the host copy starts at step end, without a sync.
        return kept_copy(value, None)

    def _keep(self, record: Record, value: Any, copied: bool = False) -> None:
        # max_bytes bounds what is kept; tensors only handed to on_tensor keep nothing.
        size = value.numel() * value.element_size()
        if self._spec.keep and not self._room_for(size):
            return
        record.value = value if copied else self._copy(value)
        self._bytes += size
        self._pending.append(record)

    def _full_message(self) -> str:
        return (
            f"layerscope: tensors= reached max_bytes={self._options.max_bytes}; later whole "
            f"tensors are not kept (scope.tensors_dropped counts them)"
        )

    def _keeps(self, step: int) -> bool:
        return self._kept_steps.keeps(step)

    def _keep_weights(self, step: int) -> None:
        for name, type_name, module_ref in self._parameters:
            module = module_ref()
            if module is None:
                continue
            for parameter_name, parameter in module.named_parameters(recurse=False):
                value = local_tensor(parameter).detach()  # an FSDP2 shard: this rank's part
                record = Record(
                    module=name,
                    type=type_name,
                    kind=Kind.WEIGHT.value,
                    tensor=parameter_name,
                    step=step,
                    phase="train",
                    call=0,
                    value=value,
                )
                try:
                    with torch.no_grad():
                        if self._options.stash_value is not None:
                            value = self._options.stash_value(value).detach()
                        with self._lock:
                            self._keep(record, value)
                except Exception as error:
                    self._failures.record(
                        f"keeping the weight {parameter_name!r} of {name!r}", error
                    )
        self._failures.warn_pending()
        self._warn_pending()
