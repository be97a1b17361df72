"""Scopes still open when the interpreter exits: closed then, as finished or failed.

The registry holds scopes weakly, so an open scope pins nothing of its own (a closure given to
``atexit`` would keep the scope, its model and its thread for the life of the process). A
script that died of an exception is recorded as ``failed``: Python keeps the exception in
``sys.last_value`` before exit handlers run. Closing at exit waits for the writer a bounded
time, so a hung sink cannot hang the interpreter's exit.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol

#: How long the close at exit waits for each scope's writer to finish.
EXIT_SECONDS = 30.0


class Closable(Protocol):
    """What the registry asks of a scope."""

    def close(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Finish the run."""


_open: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False


def track(scope: Closable) -> None:
    """Close ``scope`` at exit unless it is closed before."""
    global _registered
    if not _registered:
        atexit.register(close_open_scopes)
        _registered = True
    _open.add(scope)


def untrack(scope: Closable) -> None:
    """``scope`` is closed: nothing to do for it at exit."""
    _open.discard(scope)


def close_open_scopes() -> None:
    """Close every scope still open: ``failed`` if the program ends on an exception."""
    status = "failed" if getattr(sys, "last_value", None) is not None else "finished"
    for scope in list(_open):
        scope.close(status, timeout=EXIT_SECONDS)


def abandon(pipeline: Any, claims: Any, summary: Callable[..., Any], store: Any) -> None:
    """A scope that failed before its hooks were on: its writer stops and its run is removed."""
    claims.release()
    pipeline.close(summary, None)
    if store is not None:
        store.discard()
