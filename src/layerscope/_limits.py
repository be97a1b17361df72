"""The bounds of the numbers that ``watch()``, ``Schedule``, ``capture()`` and a store take.

Torch-free, so that a reader checking a stored ``run.json`` holds it to the bounds of the
``watch()`` that wrote it. A value past a bound is refused with a ``ValueError`` that names the
argument and the range (``check_within``); the bound itself is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The largest step number and count of steps (``start_step``, ``every``, a ``Schedule``'s
#: ``start``, ``stop`` and ``dense``): 2**53, the largest integer float64 holds exactly, as
#: JSON readers and pandas read ``run.json`` and the step columns. A run that starts there
#: still has 2**63 - 2**53 steps before its step numbers leave int64.
MAX_STEP = 2**53
#: The largest count of bytes or samples (``max_bytes``, ``noise_scale``), for the same reason.
MAX_COUNT = 2**53
#: The most bins of a linear histogram. Each recorded tensor takes a row of ``bins + 2``
#: float64 slots in its device's buffer, up to 4,096 rows a flush (128 MiB at this bound; 10**9
#: bins would take 8 GB a row), and ``run.json`` lists the ``bins + 2`` edges (about 100 KB).
MAX_LINEAR_BINS = 4096
#: The longest wait between flushes (``flush_seconds``): rows wait in memory that long, and it
#: is the run's heartbeat, by which a reader tells a crashed run from a live one.
MAX_FLUSH_SECONDS = 86_400.0
#: The longest period between kept whole tensors (``every_seconds``): a year; finite for JSON.
MAX_PERIOD_SECONDS = 365 * 86_400.0
#: The most flushes waiting for the writer (``queue_size``): a flush waiting holds its rows
#: on the host (a step's scalars alone are a few hundred bytes), so a writer that falls this
#: far behind holds gigabytes where a shorter queue would drop and count them.
MAX_QUEUE_SIZE = 1_000_000
#: The most worker processes for ``on_tensor``: each is a Python process with torch loaded.
MAX_WORKERS = 256
#: The most recorded steps a health rule keeps of each layer or head for its baseline: a
#: float64 a step, for every layer watched.
MAX_RULE_BASELINE = 1000


@dataclass(frozen=True, slots=True)
class Bound:
    """An inclusive range of finite values."""

    low: float
    high: float

    def describe(self) -> str:
        """The range in words, for messages: ``a value from 1 to 4096``."""
        if self.high == math.inf:
            return f"a finite value >= {_shown(self.low)}"
        return f"a value from {_shown(self.low)} to {_shown(self.high)}"


_FRACTION = Bound(0, 1)
_THRESHOLD = Bound(0, math.inf)  # any finite value >= 0
_STEPS = Bound(1, MAX_STEP)  # recorded steps in a row before an alert, and after it
_WARMUP = Bound(0, MAX_STEP)
_BASELINE = Bound(1, MAX_RULE_BASELINE)

#: Each health rule's numeric options and their bounds; the options of ``alerts={rule: {...}}``.
RULE_OPTION_BOUNDS: dict[str, dict[str, Bound]] = {
    "dead": {
        "threshold": _FRACTION,
        "units": _FRACTION,
        "steps": _STEPS,
        "clear_below": _FRACTION,
    },
    "vanishing_grad": {
        "vanishing_below": _THRESHOLD,
        "exploding_above": _THRESHOLD,
        "relative": _THRESHOLD,
        "steps": _STEPS,
        "growth": _THRESHOLD,
        "climb": _THRESHOLD,
    },
    "update_ratio": {"low": _THRESHOLD, "high": _THRESHOLD, "steps": _STEPS, "warmup": _WARMUP},
    "activation_drift": {"factor": _THRESHOLD, "steps": _STEPS, "baseline": _BASELINE},
    "loss_spike": {
        "sigmas": _THRESHOLD,
        "ratio": _THRESHOLD,
        "jump": _THRESHOLD,
        "window": _STEPS,  # the values the level is read from
        "warmup": _WARMUP,
    },
    "loss_collapse": {
        "factor": _THRESHOLD,
        "sigmas": _THRESHOLD,
        "window": _STEPS,  # the values the noise is read from
        "warmup": _WARMUP,
    },
    "not_learning": {
        "steps": _STEPS,  # the values before the note
        "warning_steps": _WARMUP,  # the values before the warning; 0: none
        "baseline": _BASELINE,
        "window": _STEPS,
        "fall": _FRACTION,
        "sigmas": _THRESHOLD,
    },
    "scaler_skips": {"steps": _STEPS, "falls": _STEPS, "window": _STEPS, "initial": _STEPS},
    "attention_collapse": {
        "fraction": _FRACTION,
        "frac_below": _FRACTION,
        "steps": _STEPS,
        "baseline": _BASELINE,
    },
}
RULE_OPTION_BOUNDS["exploding_grad"] = RULE_OPTION_BOUNDS["vanishing_grad"]  # one rule's options
#: The options that count steps or values: whole numbers.
WHOLE_RULE_OPTIONS = frozenset(
    ("steps", "warmup", "window", "baseline", "falls", "initial", "warning_steps")
)


def check_within(value: int | float, name: str, bound: Bound) -> None:
    """A ``ValueError`` naming ``name`` unless ``value`` is finite and within ``bound``.

    Examples:
        >>> check_within(4096, "bins", Bound(1, MAX_LINEAR_BINS))
        >>> check_within(4097, "bins", Bound(1, MAX_LINEAR_BINS))
        Traceback (most recent call last):
        ...
        ValueError: bins: expected a value from 1 to 4096, got 4097
    """
    finite = isinstance(value, int) or math.isfinite(value)  # an int past float64 compares exactly
    if not (finite and bound.low <= value <= bound.high):
        raise ValueError(f"{name}: expected {bound.describe()}, got {value!r}")


def _shown(limit: float) -> str:
    """A bound as a reader writes it: ``2**53``, or the number."""
    if limit == 2**53:
        return "2**53"
    return str(int(limit)) if float(limit).is_integer() else repr(limit)
