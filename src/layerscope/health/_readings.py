"""What the rules read: the rows of one step and phase, and the layers' order.

Rows come from a flush's ``StatsRows`` on the writer thread: a handful of statistics per row,
as Python floats, grouped by step and phase. A module called several times in a step has a row
per call; the rules read its first call's, and any call's non-finite values.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from layerscope._modules import CallEvent, ModuleInfo
from layerscope.sinks._rows import StatsRows

# The statistics the rules use; a run that keeps fewer gets fewer alerts, never an error.
USED = ("numel", "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "nan_count", "inf_count")


@dataclass(frozen=True, slots=True)
class Reading:
    """One row: a tensor of a module at a step, and its statistics (NaN where not kept)."""

    step: int
    phase: str
    module: str
    kind: str
    tensor: str
    call: int
    sentinel: bool  # the sentinel's row: only numel, min, max and absmax
    stats: dict[str, float]

    def get(self, name: str) -> float:
        """A statistic, NaN where the run does not keep it."""
        return self.stats.get(name, math.nan)

    @property
    def rms(self) -> float:
        """Root mean square of the finite elements: the tensor's scale, whatever its size."""
        numel, l2 = self.get("numel"), self.get("l2")
        return l2 / math.sqrt(numel) if numel > 0 else math.nan

    @property
    def nonfinite(self) -> bool:
        """Whether the tensor holds NaN or Inf, where the row can tell."""
        nan, inf = self.get("nan_count"), self.get("inf_count")
        if not (math.isnan(nan) and math.isnan(inf)):
            return (0 if math.isnan(nan) else nan) + (0 if math.isnan(inf) else inf) > 0
        # The sentinel's extremes are torch.aminmax's: NaN anywhere makes them NaN.
        low, high = self.get("min"), self.get("max")
        return (
            self.sentinel
            and self.get("numel") > 0
            and not (math.isfinite(low) and math.isfinite(high))
        )


@dataclass(frozen=True, slots=True)
class StepView:
    """Every row of one step and phase that a flush brought."""

    step: int
    phase: str
    readings: list[Reading]

    @property
    def sentinel(self) -> bool:
        """Whether these are the sentinel's rows (an unrecorded step)."""
        return bool(self.readings) and all(r.sentinel for r in self.readings)

    def first_calls(self, kind: str) -> list[Reading]:
        """The rows of ``kind``, each tensor's first call only."""
        return [r for r in self.readings if r.kind == kind and r.call == 0]


def step_views(chunks: Iterable[StatsRows]) -> list[StepView]:
    """The rows of ``chunks`` by step and phase, oldest step first, training before eval."""
    grouped: dict[tuple[int, str], list[Reading]] = defaultdict(list)
    for chunk in chunks:
        if not len(chunk):
            continue
        keys = chunk.key_columns()
        kept = {name: chunk.stats[name].tolist() for name in USED if name in chunk.stats}
        for i, step in enumerate(keys["step"]):
            reading = Reading(
                step=step,
                phase=keys["phase"][i],
                module=keys["module"][i],
                kind=keys["kind"][i],
                tensor=keys["tensor"][i],
                call=keys["call"][i],
                sentinel=chunk.sentinel,
                stats={name: float(values[i]) for name, values in kept.items()},
            )
            grouped[step, reading.phase].append(reading)
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

    def model(self, module: str) -> int:
        """The module's place in ``named_modules()`` order."""
        return self._model_order.get(module, len(self._model_order))

    def type_of(self, module: str) -> str:
        """The module's class name, or "" if unknown."""
        return self._types.get(module, "")
