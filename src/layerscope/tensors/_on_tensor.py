"""The ``on_tensor`` callback: checking ``watch(on_tensor=fn, workers=N)``'s arguments.

A callback runs in worker processes started by spawn, so it must pickle by reference and be
importable from a module; these checks say so when ``watch()`` is called, not in a worker.
"""

from __future__ import annotations

import functools
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

from layerscope._limits import MAX_WORKERS, Bound, check_within
from layerscope.tensors._records import Record
from layerscope.tensors._video import Video

OnTensor = Callable[[Record, Path | None], object]


def check_on_tensor(on_tensor: object, workers: object) -> tuple[OnTensor | None, int]:
    """Check ``watch()``'s ``on_tensor`` and ``workers`` arguments.

    Args:
        on_tensor: None, or ``fn(record, directory)``: a callable that pickles by reference
            (a module-level function, a class instance with picklable state, a
            ``functools.partial``), since it runs in worker processes started by spawn.
        workers: None (one worker) or an int >= 1; only with ``on_tensor``.

    Returns:
        ``(on_tensor, workers)``; ``(None, 0)`` without ``on_tensor``.

    Raises:
        TypeError: ``on_tensor`` is not callable or does not pickle, or ``workers`` is not
            an int.
        ValueError: ``workers < 1``, ``workers`` without ``on_tensor``, or a ``Video`` with
            more than one worker.

    Examples:
        >>> import functools
        >>> check_on_tensor(functools.partial(print, end=""), None)[1]
        1
        >>> check_on_tensor(lambda record, directory: None, 2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: on_tensor: must pickle by reference to run in worker processes, ...
    """
    if on_tensor is None:
        if workers is not None:
            raise ValueError("workers: only used with on_tensor=fn, which was not given")
        return None, 0
    count = check_workers(workers)
    if isinstance(on_tensor, Video) and count > 1:
        raise ValueError(
            f"workers: a Video writes each tensor's file from one worker; got workers={count}, "
            f"expected 1"
        )
    if not callable(on_tensor):
        raise TypeError(
            f"on_tensor: expected a callable fn(record, directory), got {type(on_tensor).__name__}"
        )
    check_importable(on_tensor)  # watch() starts its workers by spawn
    pickled(on_tensor)
    return on_tensor, count


def check_importable(fn: object) -> None:
    """A spawned worker imports ``fn``'s module: not possible for a notebook's or a REPL's."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(target, "__module__", None)
    if not isinstance(getattr(target, "__qualname__", None), str):
        module = type(target).__module__  # an instance: its class is what gets imported
    main = sys.modules.get("__main__")
    if module == "__main__" and main is not None and not hasattr(main, "__file__"):
        raise TypeError(
            f"on_tensor: {callback_name(fn)} is defined in an interactive session, which "
            f"worker processes cannot import; define it in a module and import it"
        )


def check_workers(workers: object) -> int:
    if workers is None:
        return 1
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"workers: expected an int >= 1, got {type(workers).__name__}")
    if workers < 1:
        raise ValueError(f"workers: expected an int >= 1, got {workers}")
    check_within(workers, "workers", Bound(1, MAX_WORKERS))
    return workers


def pickled(fn: object) -> bytes:
    try:
        return pickle.dumps(fn)
    except Exception as error:
        raise TypeError(
            f"on_tensor: must pickle by reference to run in worker processes, and "
            f"{callback_name(fn)} does not ({type(error).__name__}: {error}); define it at "
            f"module level, or use functools.partial of a module-level function"
        ) from error


def callback_name(fn: object) -> str:
    """A short name for ``fn`` in messages: ``module.qualname``, or its type's."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({callback_name(fn.func)}, ...)"
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str):
        name, module = qualname, getattr(fn, "__module__", None)
    else:
        name, module = f"{type(fn).__qualname__} instance", type(fn).__module__
    return f"{module}.{name}" if isinstance(module, str) else name
