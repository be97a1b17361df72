"""Compiled code runs eagerly on the steps that record.

On a recorded step the hooks must run eagerly. Inside compiled code each would be a graph
break, and dynamo, meeting a graph break in a loop (a ``Sequential``, a model's loop over its
blocks), gives up on that frame for good: every later step, recorded or not, would run it
uncompiled. Instead, while a step records, torch.compile's stance is ``force_eager``: the step
runs as an eager one (its statistics are exactly those), and every other step runs the
compiled graphs as unwatched, with the hooks traced away and nothing recompiled.

The stance is process-wide: other compiled functions run eagerly during a recorded step too,
except layerscope's own statistics kernel. A stance the user set is left alone.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator

import torch

_FORCED = "force_eager"
_holders: set[int] = set()  # the scopes that want recorded steps eager now
# A holder dropped without closing (a scope left open, then collected) lets go as it dies:
# else every compiled function of the process would run eagerly from then on.
_finalizers: dict[int, weakref.finalize[[int], object]] = {}


def follow_eager_stance(holder: object, records: bool) -> None:
    """``holder`` (a scope's hooks) is on a step that ``records``, or not: set the stance.

    Does nothing until dynamo is loaded: uncompiled code does not care.
    """
    key = id(holder)
    if records == (key in _holders):
        return
    if records:
        if "torch._dynamo" not in sys.modules:
            return
        if not _holders and _current() != "default":
            return  # the user's own stance
        _holders.add(key)
        with contextlib.suppress(TypeError):  # one that takes no weak reference: till released
            _finalizers[key] = weakref.finalize(holder, _let_go, key)
        if len(_holders) == 1:
            torch.compiler.set_stance(_FORCED)
    else:
        _let_go(key)


def _let_go(key: int) -> None:
    """Holder ``key`` wants no stance any more; the default comes back when none does."""
    finalizer = _finalizers.pop(key, None)
    if finalizer is not None:
        finalizer.detach()
    _holders.discard(key)
    if not _holders and _current() == _FORCED:
        torch.compiler.set_stance("default")


def release_eager_stance(holder: object) -> None:
    """``holder`` is closing: it wants no stance any more."""
    follow_eager_stance(holder, False)


@contextlib.contextmanager
def compiled_allowed() -> Iterator[None]:
    """Compiled functions run compiled inside, whatever a recorded step forced outside."""
    if not _holders or _current() != _FORCED:
        yield
        return
    with torch.compiler.set_stance("default"):
        yield


def _current() -> str:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    stance = getattr(eval_frame, "_stance", None)
    return str(getattr(stance, "stance", "default"))
