"""Readings on their way to the host: partials into device buffers, batches to the writer.

The ``Recorder`` is the hot path's end: it computes a tensor's partials on the tensor's device,
appends them to that device's buffer, interns what the row is about, and, at a flush, starts
the buffers' copy to the host and hands the batch to the writer thread. It never waits.
"""

from __future__ import annotations

import numbers
import time
import weakref
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from layerscope.model import STATE_KINDS, Form, Identities, Identity, Kind
from layerscope.recording._batches import AttentionRef, Batch, Extreme
from layerscope.recording._buffer import DeviceRows
from layerscope.recording._custom import KindStats, compute_custom
from layerscope.recording._nested import shape_of, values_of
from layerscope.recording._readings import CustomRef, Readings
from layerscope.recording._reads import Seen, check_strided, grouped, local_part, version_of
from layerscope.recording._subjects import (
    BatchOutlet,
    GroupEntry,
    Owner,
    Target,
    counted_histogram,
)
from layerscope.stats import CustomStat, HistogramSpec, write_group_partials, write_partials

# A step with many forward passes (long evaluations, much gradient accumulation) flushes when
# this many readings wait, so that device memory stays bounded; the host merges the pieces.
ROWS_PER_FLUSH = 4096
# Scalars and sentinel readings of unrecorded steps wait for the next recorded step, or until
# this many wait, or this many seconds have passed since the last flush.
UNRECORDED_PER_FLUSH = 4096
UNRECORDED_MAX_WAIT_SECONDS = 1.0


class Recorder:
    """Partials of recorded tensors, held on their devices until the next flush."""

    def __init__(
        self,
        histogram: HistogramSpec | None,
        custom: Mapping[str, CustomStat],
        identities: Identities,
        pipeline: BatchOutlet,
        fail: Callable[[str, BaseException], None],
        custom_by_kind: Mapping[str, Mapping[str, CustomStat]] | None = None,
    ) -> None:
        self.histogram = counted_histogram(histogram, pipeline)  # split by sign where asked
        self.custom = KindStats(custom, custom_by_kind)  # custom statistics, by kind
        self.identities = identities
        self.pipeline = pipeline
        self.buffers: dict[torch.device, tuple[int, DeviceRows]] = {}
        self.readings = Readings()
        self.extremes: list[Extreme] = []
        self.scalars: list[tuple[int, str, float | tuple[int, int]]] = []
        self.attention: list[AttentionRef] = []
        self.rows_per_flush = ROWS_PER_FLUSH
        self.partial = False  # the current step has flushed part of its readings
        self.holding = False  # an ended step's readings wait for its scalars (see end_step)
        self.last_flush = time.monotonic()
        # The first steps whose training and evaluation rows may still grow.
        self.open_steps: Callable[[], tuple[int, int]] = lambda: (0, 0)
        self._fail = fail
        self._seen: dict[int, Seen] = {}  # id(tensor) -> its row, until the next flush
        self._forms: dict[tuple[torch.dtype, tuple[int, ...], str | None], int] = {}
        self._identity_codes: dict[tuple[str, Kind, str, int, str], int] = {}

    def record(
        self,
        step: int,
        target: Target,
        kind: Kind,
        name: str,
        call: int,
        phase: str,
        tensor: Tensor,
        also_owned_by: Sequence[Owner] = (),
        shard: str | None = None,
    ) -> None:
        """Compute the partials of ``tensor`` on its device and keep them for the next flush.

        A tensor already recorded since the last flush, and not modified since, shares that
        row: a module's input is usually the output of the module before it. ``shard`` labels
        the shard of a sharded tensor that ``tensor`` was computed from (an update); a DTensor
        is read as its local shard and labelled itself.
        """
        self.send_held()
        if type(tensor) is not Tensor:  # a parameter, a DTensor, another subclass
            tensor, shard = local_part(tensor, shard)
        values = values_of(tensor)  # a nested tensor's elements, any other tensor itself
        check_strided(values)
        seen = self._seen.get(id(tensor))
        stats = self.custom.of(kind)
        if seen is not None and seen.tensor() is tensor and seen.version == version_of(tensor):
            buffer_id, index, custom = seen.buffer_id, seen.row, seen.custom
            if seen.stats is not stats:  # recorded before as a kind with other custom stats
                custom = self._custom_stats(self._rows_on(tensor.device)[1], values, stats)
        else:
            buffer_id, rows = self._rows_on(tensor.device)
            index = rows.reserve()
            write_partials(values, self.histogram, rows.data, index)
            custom = self._custom_stats(rows, values, stats)
            self._remember(tensor, buffer_id, index, custom, stats)
        self._add(step, target, kind, name, call, phase, tensor, shard, also_owned_by,
                  (buffer_id, index, custom))  # fmt: skip
        self._flush_if_full()

    def record_group(
        self, step: int, kind: Kind, phase: str, entries: Sequence[GroupEntry]
    ) -> None:
        """``record`` each of ``entries``, read together: parameters, gradients, updates.

        Tensors of one device and dtype that the GPU kernels read take one launch pair for
        all of them; the rest are read one by one. A tensor that cannot be read costs only
        its own row (``fail`` names it).
        """

        def alone(entry: GroupEntry) -> None:
            self.record(step, entry.target, kind, entry.name, 0, phase, entry.tensor,
                        entry.also_owned_by, entry.shard)  # fmt: skip

        self.send_held()
        groups = grouped(entries, kind, "reading", alone, self._fail)
        for (device, _), members in groups.items():
            try:
                buffer_id, rows = self._rows_on(device)
                first = rows.reserve(len(members))
                tensors = [entry.tensor for entry in members]
                write_group_partials(tensors, self.histogram, rows.data, first)
            except Exception as error:
                self._fail(f"reading {kind.value} of {len(members)} tensors", error)
                continue
            for index, entry in enumerate(members, start=first):
                custom = self._custom_stats(rows, entry.tensor, self.custom.of(kind))
                self._add(step, entry.target, kind, entry.name, 0, phase, entry.tensor,
                          entry.shard, entry.also_owned_by, (buffer_id, index, custom))  # fmt: skip
        self._flush_if_full()  # after the groups: a flush empties the rows they point to

    def _remember(
        self,
        tensor: Tensor,
        buffer_id: int,
        index: int,
        custom: tuple[CustomRef, ...],
        stats: Mapping[str, CustomStat],
    ) -> None:
        """Let a later reading of ``tensor``, unchanged, share its row."""
        version = version_of(tensor)
        if version is not None:
            seen = Seen(weakref.ref(tensor), version, buffer_id, index, custom, stats)
            self._seen[id(tensor)] = seen

    def _add(
        self,
        step: int,
        target: Target,
        kind: Kind,
        name: str,
        call: int,
        phase: str,
        tensor: Tensor,
        shard: str | None,
        also_owned_by: Sequence[Owner],
        row: tuple[int, int, tuple[CustomRef, ...]],
    ) -> None:
        """Add the readings of ``tensor``, whose partials are in ``row`` (buffer, index, custom)."""
        buffer_id, index, custom = row
        form = self._form_code(tensor, shard)
        replaces = kind in STATE_KINDS
        readings = self.readings
        code = self._identity_code(target, kind, name, call, phase)
        readings.add(step, code, form, buffer_id, index, replaces, custom)
        for owner in also_owned_by:  # tied: computed once, reported under every owner
            alias = Identity(phase, owner.module, owner.module_type, kind, owner.tensor, call)
            code = self.identities.code(alias)
            readings.add(step, code, form, buffer_id, index, replaces, custom)

    def _flush_if_full(self) -> None:
        # A step with many forward passes flushes part of its readings: device memory stays
        # bounded.
        if len(self.readings) >= self.rows_per_flush:
            self.flush(final=False)

    def record_extremes(
        self,
        step: int,
        target: Target,
        kind: Kind,
        name: str,
        call: int,
        phase: str,
        tensor: Tensor,
    ) -> None:
        """The sentinel: keep the minimum and maximum of ``tensor``, one reduction, no sync.

        NaN and Inf propagate into them, so a non-finite value shows; tensors that are not
        floating point or are empty are skipped.
        """
        self.send_held()
        shard = None
        if type(tensor) is not Tensor:
            tensor, shard = local_part(tensor, shard)
        values = values_of(tensor)  # a nested tensor's elements, any other tensor itself
        if not values.is_floating_point() or values.numel() == 0:
            return
        check_strided(values)
        buffer_id, rows = self._rows_on(tensor.device)
        pair = rows.add_extremes(values)
        code = self._identity_code(target, kind, name, call, phase)
        form = self._form_code(tensor, shard)
        self.extremes.append(Extreme(step, code, form, buffer_id, pair, values.numel()))
        if len(self.extremes) >= self.rows_per_flush:  # very many forwards in one step
            self.flush(final=False)

    def record_group_extremes(
        self, step: int, kind: Kind, phase: str, entries: Sequence[GroupEntry]
    ) -> None:
        """The sentinel over tensors read together (the parameters' gradients).

        ``record_extremes`` of each, with one launch pair per device and dtype where the GPU
        kernels read them.
        """

        def alone(entry: GroupEntry) -> None:
            self.record_extremes(step, entry.target, kind, entry.name, 0, phase, entry.tensor)

        self.send_held()
        for (device, _), group in grouped(entries, kind, "watching", alone, self._fail).items():
            # As record_extremes: tensors that are not floating point or are empty are skipped.
            members = [e for e in group if e.tensor.is_floating_point() and e.tensor.numel()]
            try:
                buffer_id, rows = self._rows_on(device)
                first = rows.add_group_extremes([entry.tensor for entry in members])
            except Exception as error:
                self._fail(f"watching {kind.value} of {len(members)} tensors", error)
                continue
            for pair, entry in enumerate(members, start=first):
                code = self._identity_code(entry.target, kind, entry.name, 0, phase)
                form = self._form_code(entry.tensor, entry.shard)
                numel = entry.tensor.numel()
                self.extremes.append(Extreme(step, code, form, buffer_id, pair, numel))
        if len(self.extremes) >= self.rows_per_flush:
            self.flush(final=False)

    def _identity_code(self, target: Target, kind: Kind, name: str, call: int, phase: str) -> int:
        # A plain tuple's lookup is 5x faster than making and hashing an Identity; a target's
        # name is unique in a scope, so it stands for its type.
        key = (target.name, kind, name, call, phase)
        code = self._identity_codes.get(key)
        if code is None:
            identity = Identity(phase, target.name, target.module_type, kind, name, call)
            code = self._identity_codes[key] = self.identities.code(identity)
        return code

    def _form_code(self, tensor: Tensor, shard: str | None) -> int:
        # A nested tensor's ragged dims are -1: its components' shapes differ.
        shape = shape_of(tensor) if tensor.is_nested else tensor.shape
        key = (tensor.dtype, shape, shard)
        code = self._forms.get(key)
        if code is None:
            form = Form(str(tensor.dtype).removeprefix("torch."), tuple(shape), shard)
            code = self._forms[key] = self.identities.form_code(form)
        return code

    def add_scalars(self, step: int, scalars: Mapping[str, float | Tensor]) -> None:
        """Keep scalars of ``step``; tensors stay on their device until the flush."""
        for name, value in scalars.items():
            if isinstance(value, Tensor):
                if value.numel() != 1:
                    raise ValueError(
                        f"step: scalar {name!r} must have one element, got shape "
                        f"{tuple(value.shape)}"
                    )
                buffer_id, rows = self._rows_on(value.device)
                offset, _ = rows.add_values(value)
                self.scalars.append((step, name, (buffer_id, offset)))
            elif isinstance(value, int | float | numbers.Real):  # numpy scalars too
                self.scalars.append((step, name, float(value)))
            else:
                raise TypeError(
                    f"step: scalar {name!r} must be a number or a one-element tensor, "
                    f"got {type(value).__name__}"
                )

    def add_attention(
        self, step: int, phase: str, module: str, call: int, keys: int, partials: Tensor
    ) -> None:
        """Keep an attention call's per-head partials (heads x width, on its device)."""
        self.send_held()
        buffer_id, rows = self._rows_on(partials.device)
        offset, _ = rows.add_values(partials)
        ref = AttentionRef(step, phase, module, call, keys, partials.shape[0], buffer_id, offset)
        self.attention.append(ref)

    def has_pending(self) -> bool:
        """Whether anything waits, or a step has flushed only part of its readings."""
        return (
            bool(self.readings or self.extremes or self.scalars or self.attention or self.partial)
            or self.holding
        )

    def unrecorded_due(self) -> bool:
        """Whether scalars and sentinel readings should go now, though the step records nothing."""
        waiting = len(self.scalars) + len(self.extremes)
        if not waiting:
            return False
        waited = time.monotonic() - self.last_flush
        return waiting >= UNRECORDED_PER_FLUSH or waited >= UNRECORDED_MAX_WAIT_SECONDS

    def end_step(self, step_records: bool, scalars_follow: bool = False) -> None:
        """The step ends: send its readings, or scalars and sentinel readings that are due.

        ``scalars_follow``: they wait for the step's scalars, or the next reading, and go
        with them (``send_held``): one batch, one flush of the writer.
        """
        pending = self.readings or self.attention or self.partial
        if pending or (step_records and self.has_pending()) or self.unrecorded_due():
            self.holding = scalars_follow
            if not scalars_follow:
                self.flush(final=True)

    def send_held(self) -> None:
        """Send the readings of a step that ended, with the scalars given since, if they wait."""
        if self.holding:
            self.flush(final=True)

    def send_complete(self, readings_only: bool = False) -> None:
        """Send what is complete before the step ends.

        That is evaluation rows (the step's training rows wait with the writer for the rest)
        and, unless ``readings_only``, scalars and the sentinel's readings.
        """
        if (
            self.readings
            or self.attention
            or (not readings_only and (self.extremes or self.scalars))
        ):
            self.flush(final=False, evaluated=True)

    def flush(self, final: bool, evaluated: bool = False) -> None:
        """Start the copy of what the buffers hold to the host.

        ``final`` ends a step: its rows are complete. ``evaluated`` says that the evaluation
        rows so far are, though the step's training rows may still grow.
        """
        final = final or self.holding  # an ended step's readings, complete
        try:
            copies = {
                buffer_id: rows.take()
                for buffer_id, rows in self.buffers.values()
                if rows.has_content()
            }
            batch = Batch(
                self.readings,
                copies,
                self.scalars,
                final,
                self.extremes,
                evaluated,
                self.open_steps(),
                self.attention,
                self.histogram is not None and self.histogram.signed,
            )
            self.pipeline.submit(batch)
        except Exception:
            self.pipeline.count_dropped(len(self.readings) + len(self.extremes), len(self.scalars))
            raise
        finally:  # sent or dropped, they are gone: the next readings start afresh
            self.readings, self.scalars, self.extremes, self.attention = Readings(), [], [], []
            self._seen.clear()  # row indices start again in the emptied buffers
            self.partial, self.holding = not final, False
            self.last_flush = time.monotonic()

    def _custom_stats(
        self, rows: DeviceRows, tensor: Tensor, stats: Mapping[str, CustomStat]
    ) -> tuple[CustomRef, ...]:
        return compute_custom(rows, tensor, stats, self._fail) if stats else ()

    def _rows_on(self, device: torch.device) -> tuple[int, DeviceRows]:
        entry = self.buffers.get(device)
        if entry is None:
            slots = self.histogram.slots if self.histogram is not None else 0
            entry = (len(self.buffers), DeviceRows(device, slots))
            self.buffers[device] = entry
        return entry
