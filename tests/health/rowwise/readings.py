"""What the rules read: the rows of one step and phase, and the layers' order.

Rows come from a flush's ``StatsRows`` on the writer thread: a handful of statistics per row,
as Python floats, grouped by step and phase. A module called several times in a step has a row
per call; the rules read its first call's, and any call's non-finite values.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from layerscope.model import CallEvent, ModuleInfo, StatsRows

# The statistics the rules use; a run that keeps fewer gets fewer alerts, never an error.
USED = ("numel", "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "nan_count", "inf_count")


class Reading:
    """One row: a tensor of a module at a step, and its statistics (NaN where not kept).

    ``rms`` (the root mean square of the finite elements: the tensor's scale, whatever its
    size) and ``nonfinite`` (whether it holds NaN or Inf, where the row can tell) are worked
    out once: every rule asks.
    """

    __slots__ = (
        "call", "kind", "module", "nonfinite", "phase", "rms", "sentinel", "stats", "step",
        "tensor",
    )  # fmt: skip

    def __init__(
        self,
        step: int,
        phase: str,
        module: str,
        kind: str,
        tensor: str,
        call: int,
        sentinel: bool,  # the sentinel's row: only numel, min, max and absmax
        stats: dict[str, float],
    ) -> None:
        self.step = step
        self.phase = phase
        self.module = module
        self.kind = kind
        self.tensor = tensor
        self.call = call
        self.sentinel = sentinel
        self.stats = stats
        numel = stats.get("numel", math.nan)
        self.rms = stats.get("l2", math.nan) / math.sqrt(numel) if numel > 0 else math.nan
        # An input's or a buffer's -inf is an additive attention mask, not a fault: only
        # their NaN counts.
        masks = kind in ("input", "buffer")
        self.nonfinite = _nonfinite(_nan_only(stats) if masks else stats, sentinel)

    def get(self, name: str) -> float:
        """A statistic, NaN where the run does not keep it."""
        return self.stats.get(name, math.nan)


def _nan_only(stats: dict[str, float]) -> dict[str, float]:
    return {name: value for name, value in stats.items() if name != "inf_count"}


def _nonfinite(stats: dict[str, float], sentinel: bool) -> bool:
    nan, inf = stats.get("nan_count"), stats.get("inf_count")
    if nan is not None or inf is not None:
        return (nan or 0) + (inf or 0) > 0
    # The sentinel's extremes are torch.aminmax's: NaN anywhere makes them NaN.
    low, high = stats.get("min", math.nan), stats.get("max", math.nan)
    return (
        sentinel and stats.get("numel", 0) > 0 and not (math.isfinite(low) and math.isfinite(high))
    )


class StepView:
    """Every row of one step and phase that a flush brought."""

    __slots__ = ("_first_calls", "phase", "readings", "sentinel", "skipped", "step")

    def __init__(self, step: int, phase: str, readings: list[Reading]) -> None:
        self.step = step
        self.phase = phase
        self.readings = readings
        # Whether these are the sentinel's rows (an unrecorded step).
        self.sentinel = bool(readings) and all(r.sentinel for r in readings)
        # Whether the step is marked skipped (scalar ``skipped``): the model trained and the
        # optimizer given to watch() did not step (GradScaler skipped it, or the loop never
        # steps it). The monitor marks it, from the flush's scalars.
        self.skipped = False
        self._first_calls: dict[str, list[Reading]] = defaultdict(list)
        for reading in readings:
            if reading.call == 0:
                self._first_calls[reading.kind].append(reading)

    def first_calls(self, kind: str) -> list[Reading]:
        """The rows of ``kind``, each tensor's first call only."""
        return self._first_calls.get(kind, [])


def step_views(chunks: Iterable[StatsRows]) -> list[StepView]:
    """The rows of ``chunks`` by step and phase, oldest step first, training before eval."""
    grouped: dict[tuple[int, str], list[Reading]] = defaultdict(list)
    for chunk in chunks:
        if not len(chunk):
            continue
        # Each identity decoded once, not once a row.
        table = chunk.identities.identities
        decoded = {
            code: (i.phase, i.module, i.kind.value, i.tensor, i.call)
            for code in set(chunk.identity.tolist())
            for i in (table[code],)
        }
        names = [name for name in USED if name in chunk.stats]
        columns = [chunk.stats[name].tolist() for name in names]
        if "dead_units" in chunk.custom:  # the custom statistic health.dead_units, if kept
            names.append("dead_units")
            columns.append([math.nan if v is None else v for v in chunk.custom["dead_units"]])
        values = zip(*columns, strict=True)
        rows = zip(chunk.step.tolist(), chunk.identity.tolist(), values, strict=True)
        for step, code, row in rows:
            phase, module, kind, tensor, call = decoded[code]
            stats = dict(zip(names, row, strict=True))
            reading = Reading(step, phase, module, kind, tensor, call, chunk.sentinel, stats)
            grouped[step, phase].append(reading)
    order = sorted(grouped, key=lambda key: (key[0], key[1] != "train"))
    return [StepView(step, phase, grouped[step, phase]) for step, phase in order]


class ModuleOrder:
    """Where each module's output comes in a forward pass: its exit in the call order.

    The call order of a recorded step says it where layerscope logged one; until then, and for
    modules it lacks, the order of ``named_modules()`` stands in (children after parents,
    which is the exit order only for leaves: parents exit after their children).
    """

    def __init__(self, modules: Sequence[ModuleInfo]) -> None:
        self._model_order = {info.name: i for i, info in enumerate(modules)}
        self._types = {info.name: info.type for info in modules}
        self._exits: dict[str, int] = {}

    def learn(self, calls: Sequence[CallEvent]) -> None:
        """Take the exit order of a logged call order (first calls only)."""
        exits = [c.module for c in calls if c.event == "exit" and c.call == 0]
        if exits:
            self._exits = {module: i for i, module in enumerate(exits)}

    def forward(self, module: str) -> tuple[int, int]:
        """A sort key: earlier in the forward pass first."""
        if module in self._exits:
            return (0, self._exits[module])
        return (1, self._model_order.get(module, len(self._model_order)))

    def called(self, module: str) -> bool:
        """Whether the module has a place in the forward pass: every one until a call order."""
        return not self._exits or module in self._exits

    def model(self, module: str) -> int:
        """The module's place in ``named_modules()`` order."""
        return self._model_order.get(module, len(self._model_order))

    def type_of(self, module: str) -> str:
        """The module's class name, or "" if unknown."""
        return self._types.get(module, "")
