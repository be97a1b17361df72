"""Warnings layerscope issues, and the rule that monitoring never breaks training."""

from __future__ import annotations

import threading
import warnings


class LayerscopeWarning(UserWarning):
    """Something went wrong in monitoring; training was not affected."""


class NonFiniteError(FloatingPointError):
    """A watched tensor held NaN or Inf, and ``watch(alerts="raise")`` stops training there."""


class FailureCounter:
    """Counts monitoring failures; the first becomes one warning, later ones are only counted.

    The writer thread only records: its warning is emitted by ``warn_pending()`` on the
    training thread, where the user sees it and where warning filters apply.
    """

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        self._warned = False
        self._lock = threading.Lock()

    def record(self, where: str, error: BaseException) -> None:
        """Count ``error`` raised in ``where``."""
        with self._lock:
            self.count += 1
            if self.first is None:
                self.first = f"{where} failed ({type(error).__name__}: {error})"

    def warn_pending(self) -> None:
        """Emit the warning for the first failure, once."""
        if self.first is None or self._warned:
            return
        self._warned = True
        warnings.warn(
            f"layerscope: {self.first} and was skipped; training continues, later failures "
            f"are only counted",
            LayerscopeWarning,
            stacklevel=3,
        )
