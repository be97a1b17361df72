"""Numbers, ratios and times as the command prints them: compact and stable across machines."""

from __future__ import annotations

import math
import time

MISSING = "-"  # a value the run does not have, apart from a NaN it recorded


def number(value: object) -> str:
    """A statistic in 4 significant digits; integers as they are.

    Examples:
        >>> [number(v) for v in (0.54921, 1.2346e-05, 12345.6, 3, 0.0, float("nan"), None)]
        ['0.5492', '1.235e-05', '1.235e+04', '3', '0', 'nan', '-']
    """
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, float):
        try:
            value = float(value)  # type: ignore[arg-type]  # numpy and pandas scalars
        except (TypeError, ValueError):
            return str(value)
    if math.isnan(value):
        return "nan"
    if value.is_integer() and abs(value) < 1e6:
        return str(int(value))  # counts held as floats: "3", not "3.0"
    return f"{value:.4g}"


def ratio(latest: float | None, first: float | None) -> str:
    """``latest / first`` as ``x1.02``; empty where it means nothing (a zero or missing first).

    Examples:
        >>> ratio(1.5, 1.0), ratio(0.0, 0.0), ratio(1.0, 0.0), ratio(None, 1.0)
        ('x1.5', 'x1', '', '')
    """
    if latest is None or first is None or math.isnan(latest) or math.isnan(first):
        return ""
    if latest == first:
        return "x1"
    if first == 0 or math.isinf(first):
        return ""
    return f"x{latest / first:.3g}"


def relative(difference: float) -> str:
    """A relative difference as a signed percentage.

    Examples:
        >>> relative(0.1234), relative(-2.0), relative(0.0), relative(float("inf"))
        ('+12.3%', '-200%', '0%', '+inf')
    """
    if math.isnan(difference):
        return "nan"
    if math.isinf(difference):
        return "+inf" if difference > 0 else "-inf"
    if difference == 0:
        return "0%"
    return f"{difference * 100:+.3g}%"


def timestamp(seconds: object) -> str:
    """Seconds since the epoch as a UTC time to the second; ``-`` for none.

    Examples:
        >>> timestamp(0), timestamp(None)
        ('1970-01-01 00:00:00 UTC', '-')
    """
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return MISSING
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def duration(seconds: float) -> str:
    """A span of time in the largest unit that keeps it short.

    Examples:
        >>> duration(0.0123), duration(75), duration(7200)
        ('0.0123 s', '1.2 min', '2 h')
    """
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.3g} h"


def text(value: object) -> str:
    """A text cell; ``-`` for a missing value (None, or the NaN pandas puts in its place).

    Examples:
        >>> text("fc1"), text(None), text(float("nan"))
        ('fc1', '-', '-')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return str(value)
