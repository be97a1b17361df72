"""What layerscope costs the training thread, measured by itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class CostMeter:
    """Seconds spent on the training thread by hooks, parameter reads and flushes.

    Hooks add to ``seconds`` themselves (a ``perf_counter`` pair is the cheapest timer);
    ``timed`` is for the rest.
    """

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action(*args)`` and count its time."""
        start = time.perf_counter()
        try:
            action(*args)
        finally:
            self.seconds += time.perf_counter() - start
