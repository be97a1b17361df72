"""Robust levels of a logged loss: its recent low, typical level and step-to-step noise.

The loss rules judge a value against the values just before it, on a log scale (a loss's
noise grows with the loss: a batch that is twice as hard doubles it, whatever its level).
Medians and the median absolute deviation of the steps between values are robust: the fall
of the first steps, a spike or a noisy batch do not move them as they move a mean.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence

# The median of |x - median| of normal noise is this many times its standard deviation.
_MAD_TO_SIGMA = 1.4826
# The noise is at least this much on the log scale (1%): a loss that barely moves is not
# judged by differences of rounding.
NOISE_FLOOR = 0.01
# The low of a window is the least median of this many values in a row: one lucky batch
# is not a low.
LOW_RUN = 7


class RecentLoss:
    """The last ``window`` positive finite values of a scalar, on the log scale, and their steps."""

    def __init__(self, window: int) -> None:
        self._logs: deque[float] = deque(maxlen=max(window, 2))
        self._steps: deque[int] = deque(maxlen=max(window, 2))

    def __len__(self) -> int:
        return len(self._logs)

    @property
    def logs(self) -> list[float]:
        """The kept values' logarithms, oldest first."""
        return list(self._logs)

    @property
    def steps(self) -> list[int]:
        """The kept values' steps, oldest first."""
        return list(self._steps)

    def judged(self, value: float, warmup: int, step: int = -1) -> list[float] | None:
        """Keep finite ``value``; the logs before it where it can be judged against them.

        None while fewer than ``warmup`` (at least 2) values came before it, and for a value
        <= 0 (no log scale).
        """
        logs = self.logs
        self.add(value, step)
        if len(logs) < max(warmup, 2) or value <= 0:
            return None
        return logs

    def add(self, value: float, step: int = -1) -> None:
        """Keep finite ``value`` of ``step``; one <= 0 empties the window (no log scale)."""
        if value > 0:
            self._logs.append(math.log(value))
            self._steps.append(step)
        else:
            self._logs.clear()
            self._steps.clear()


def noise(logs: Sequence[float]) -> float:
    """The standard deviation of the noise of one step, from the steps' differences.

    The median absolute deviation of the differences, as a standard deviation, over the
    square root of 2 (a difference holds two values' noise); at least ``NOISE_FLOOR``.
    """
    steps = [after - before for before, after in itertools.pairwise(logs)]
    if len(steps) < 2:
        return NOISE_FLOOR
    middle = statistics.median(steps)
    spread = statistics.median(abs(step - middle) for step in steps)
    return max(_MAD_TO_SIGMA * spread / math.sqrt(2), NOISE_FLOOR)


def low(logs: Sequence[float]) -> float:
    """The window's low: the least median of ``LOW_RUN`` values in a row (all, if fewer)."""
    return statistics.median(logs[slice(*low_run(logs))])


def low_run(logs: Sequence[float]) -> tuple[int, int]:
    """Where the window's low is: the ``(start, end)`` of its first run of least median."""
    run = min(LOW_RUN, len(logs))
    start = min(range(len(logs) - run + 1), key=lambda i: statistics.median(logs[i : i + run]))
    return start, start + run


def since_low(logs: Sequence[float]) -> list[float]:
    """The values from the window's least value on."""
    least = min(range(len(logs)), key=logs.__getitem__)
    return list(logs[least:])
