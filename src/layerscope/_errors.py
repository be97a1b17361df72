"""Warnings layerscope issues, and the rule that monitoring never breaks training."""

from __future__ import annotations

import warnings


class LayerscopeWarning(UserWarning):
    """Something went wrong in monitoring; training was not affected."""


class FailureCounter:
    """Counts monitoring failures and warns once per scope, so training goes on undisturbed."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first: BaseException | None = None

    def record(self, where: str, error: BaseException) -> None:
        """Count ``error`` raised in ``where``; the first one becomes a warning."""
        self.count += 1
        if self.first is None:
            self.first = error
            warnings.warn(
                f"layerscope: {where} failed and was skipped ({type(error).__name__}: {error}); "
                f"training continues, later failures are only counted",
                LayerscopeWarning,
                stacklevel=3,
            )
