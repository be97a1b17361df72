"""Which steps get full statistics, and which the cheap per-step sentinel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from layerscope._limits import MAX_STEP, Bound, check_within


@dataclass(frozen=True, slots=True)
class Schedule:
    """Steps that are recorded: the first ``dense`` steps from ``start``, then every ``every``.

    Every other step before ``stop`` can get a sentinel, of one of two kinds:

    - ``"gradients"``: the minimum and maximum of each watched parameter's gradient, read
      where the weight gradients are read (before the optimizer's step, or when backward
      ends), all of a dtype at once: on a GPU two kernel launches a step, and no module
      hook. It gives the step of the first NaN or Inf that reaches a gradient (one in the
      forward pass reaches every gradient upstream of the loss), and the layers whose
      gradients hold it; it does not see the forward pass, so it cannot say which layer a
      forward NaN came from.
    - ``True``: the minimum and maximum of each watched activation and output gradient, one
      reduction per tensor in the module's hooks, so that a NaN, an Inf or a spike between
      recorded steps is seen at the step and layer where it happened. It costs a hook call
      and a reduction per tensor: on a CPU a pass over every activation and gradient, 5% to
      15% of a step in BENCHMARKS.md.

    By default (``sentinel=None``) the gradients' sentinel runs where the model's parameters
    are on an accelerator, and none on the CPU; ``False`` turns both off.

    Args:
        every: record one step in ``every`` (counted from ``start``).
        start: first step that may be recorded.
        stop: first step that is no longer recorded nor watched; None goes on to the end.
        dense: record every step of the first ``dense`` steps from ``start``, then go sparse.
        sentinel: how the steps that are not recorded are watched: None (the gradients'
            sentinel on an accelerator, none on the CPU), ``"gradients"``, True (every
            watched activation and output gradient) or False (not at all).

    Examples:
        >>> schedule = Schedule(every=10, dense=3)
        >>> [step for step in range(25) if schedule.records(step)]
        [0, 1, 2, 10, 20]
        >>> Schedule(every=10, sentinel=True).sentinel_at(4), schedule.sentinel_at(10)
        (True, False)
        >>> schedule.gradient_sentinel_at(4, on_accelerator=True), schedule.sentinel_at(4, True)
        (True, False)
    """

    every: int = 1
    start: int = 0
    stop: int | None = None
    dense: int = 0
    sentinel: bool | Literal["gradients"] | None = None

    def __post_init__(self) -> None:
        if not (self.sentinel is None or isinstance(self.sentinel, bool)) and (
            self.sentinel != "gradients"
        ):
            raise TypeError(
                "Schedule: sentinel must be None, 'gradients', True or False, got "
                f"{self.sentinel!r}"
            )
        for name in ("every", "start", "dense"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Schedule: {name} must be an int, got {value!r}")
        if self.every < 1:
            raise ValueError(f"Schedule: every must be >= 1, got {self.every}")
        if self.start < 0 or self.dense < 0:
            raise ValueError(
                f"Schedule: start and dense must be >= 0, got start={self.start}, "
                f"dense={self.dense}"
            )
        stop = self.stop
        if stop is not None and (not isinstance(stop, int) or isinstance(stop, bool)):
            raise TypeError(f"Schedule: stop must be None or an int, got {stop!r}")
        if stop is not None and stop < self.start:
            raise ValueError(f"Schedule: stop must be >= start, got {self.stop!r}")
        # A step number stays exact in float64 and within int64 for the run's lifetime.
        for name in ("every", "start", "dense", "stop"):
            value = getattr(self, name)
            if value is not None:
                check_within(value, f"Schedule: {name}", Bound(0, MAX_STEP))

    def records(self, step: int) -> bool:
        """Whether ``step`` gets full statistics."""
        if step < self.start or (self.stop is not None and step >= self.stop):
            return False
        since_start = step - self.start
        return since_start < self.dense or since_start % self.every == 0

    def sentinel_at(self, step: int, on_accelerator: bool = False) -> bool:
        """Whether ``step`` gets the sentinel of every activation and output gradient.

        Only ``sentinel=True`` asks for it, wherever the model is: ``on_accelerator`` is kept
        for callers of the time when the default ran it on accelerators.
        """
        return self.sentinel is True and self._unrecorded(step)

    def gradient_sentinel_at(self, step: int, on_accelerator: bool = False) -> bool:
        """Whether ``step`` gets the sentinel of the parameters' gradients."""
        wanted = self.sentinel == "gradients" or (self.sentinel is None and on_accelerator)
        return wanted and self._unrecorded(step)

    def _unrecorded(self, step: int) -> bool:
        """Whether ``step`` comes before ``stop`` and is not recorded."""
        return (self.stop is None or step < self.stop) and not self.records(step)

    def to_dict(self) -> dict[str, int | bool | str | None]:
        """JSON-ready form, saved with the run."""
        return {
            "every": self.every,
            "start": self.start,
            "stop": self.stop,
            "dense": self.dense,
            "sentinel": self.sentinel,
        }


#: What ``every=None`` means: every step of the first 10, where most training pathologies
#: show, then one step in 100. On a 2-core CPU full statistics of every kind cost 1.2x to 1.5x
#: a step (BENCHMARKS.md); one step in 100 spreads that to at most 1.005x. The gradients'
#: sentinel watches the steps between where the model is on an accelerator; on the CPU
#: neither sentinel is a default: each costs 1.04x or more an unrecorded step there, every
#: step (benchmarks/overhead.py), and the logged loss dates a NaN between recorded steps.
DEFAULT_SCHEDULE = Schedule(every=100, dense=10)


def parse_every(every: object) -> Schedule:
    """``every=``: None for the default, an int ``N >= 1``, or a ``Schedule``."""
    if every is None:
        return DEFAULT_SCHEDULE
    if isinstance(every, Schedule):
        return every
    if isinstance(every, int) and not isinstance(every, bool):
        if every <= 0:
            raise ValueError(f"every: expected an int >= 1 or a Schedule, got {every}")
        check_within(every, "every", Bound(1, MAX_STEP))
        return Schedule(every=every)
    raise TypeError(f"every: expected an int >= 1, a Schedule or None, got {every!r}")
