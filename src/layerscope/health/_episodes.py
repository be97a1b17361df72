"""Hysteresis: one alert per episode of a condition, not one per step it holds."""

from __future__ import annotations

from collections.abc import Hashable


class Episodes:
    """Which keys (a rule's layer and tensor) are in an episode now.

    A condition opens an episode when it holds for ``patience`` observations in a row; the
    episode stays open, alerting no more, until the condition has cleared ``recovery`` times in
    a row. A rule gives ``True`` for "holds", ``False`` for "clear", and a middle band of its
    own (neither) as ``None``, which keeps the current state: that band is the hysteresis.
    """

    def __init__(self, patience: int = 1, recovery: int = 1) -> None:
        if patience < 1 or recovery < 1:
            raise ValueError("patience and recovery: expected at least 1")
        self._patience = patience
        self._recovery = recovery
        self._streak: dict[Hashable, int] = {}  # observations in a row that held
        self._clear: dict[Hashable, int] = {}  # observations in a row that cleared, when open
        self._open: set[Hashable] = set()

    def active(self) -> set[Hashable]:
        """The keys whose next observation may matter: in an episode, or holding in a row.

        Any other key's observation that does not hold changes nothing.
        """
        return self._open | set(self._streak)

    def observe(self, key: Hashable, holds: bool | None, at_once: bool = False) -> bool:
        """Note one observation of ``key``; True exactly when it opens an episode.

        ``at_once`` (with ``holds``) opens it without waiting for ``patience``: for a
        condition so far past its bound that no single odd observation reaches it.
        """
        if holds is None:
            return False
        if key in self._open:
            if holds:
                self._clear.pop(key, None)
                return False
            cleared = self._clear.get(key, 0) + 1
            if cleared >= self._recovery:
                self._open.discard(key)
                self._clear.pop(key, None)
                self._streak.pop(key, None)
            else:
                self._clear[key] = cleared
            return False
        if not holds:
            self._streak.pop(key, None)
            return False
        streak = self._streak.get(key, 0) + 1
        self._streak[key] = streak
        if streak >= self._patience or at_once:
            self._open.add(key)
            return True
        return False
