"""Which steps get full statistics, and which the cheap per-step sentinel."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Schedule:
    """Steps that are recorded: the first ``dense`` steps from ``start``, then every ``every``.

    Every other step before ``stop`` can get the sentinel: the minimum and maximum of each
    watched activation and gradient, one reduction per tensor, so that a NaN, an Inf or a
    spike between recorded steps is seen at the step and layer where it happened. On a GPU
    that is a few microseconds of kernel launches a step; on a CPU it is a pass over every
    activation and gradient, 5% to 15% of a step in BENCHMARKS.md. So by default
    (``sentinel=None``) it runs where the model's parameters are on an accelerator, not on
    the CPU; ``True`` and ``False`` turn it on and off everywhere.

    Args:
        every: record one step in ``every`` (counted from ``start``).
        start: first step that may be recorded.
        stop: first step that is no longer recorded nor watched; None goes on to the end.
        dense: record every step of the first ``dense`` steps from ``start``, then go sparse.
        sentinel: watch the steps that are not recorded with the sentinel: None for on an
            accelerator only, True, or False.

    Examples:
        >>> schedule = Schedule(every=10, dense=3)
        >>> [step for step in range(25) if schedule.records(step)]
        [0, 1, 2, 10, 20]
        >>> Schedule(every=10, sentinel=True).sentinel_at(4), schedule.sentinel_at(10)
        (True, False)
    """

    every: int = 1
    start: int = 0
    stop: int | None = None
    dense: int = 0
    sentinel: bool | None = None

    def __post_init__(self) -> None:
        if self.sentinel is not None and not isinstance(self.sentinel, bool):
            raise TypeError(
                f"Schedule: sentinel must be None, True or False, got {self.sentinel!r}"
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

    def records(self, step: int) -> bool:
        """Whether ``step`` gets full statistics."""
        if step < self.start or (self.stop is not None and step >= self.stop):
            return False
        since_start = step - self.start
        return since_start < self.dense or since_start % self.every == 0

    def sentinel_at(self, step: int, on_accelerator: bool = False) -> bool:
        """Whether ``step`` gets the sentinel: every step before ``stop`` not recorded."""
        wanted = on_accelerator if self.sentinel is None else self.sentinel
        if not wanted or (self.stop is not None and step >= self.stop):
            return False
        return not self.records(step)

    def to_dict(self) -> dict[str, int | bool | None]:
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
#: a step (BENCHMARKS.md); one step in 100 spreads that to at most 1.005x. The sentinel watches
#: the steps between where the model is on an accelerator.
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
        return Schedule(every=every)
    raise TypeError(f"every: expected an int >= 1, a Schedule or None, got {every!r}")
