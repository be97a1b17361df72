"""Gates that torch.compile traces away: a hook runs only on the steps that need it.

A gate reads the ``StepClock``'s Python bools, which dynamo guards on, so a compiled model
keeps one graph on unrecorded steps. Recorded steps of a compiled model run eagerly (see
``_stance``); where one does run compiled anyway (a stance of the user's own), its hooks run
eagerly through one trampoline, as graph breaks, and the statistics are those of an eager run.
The bools change only between passes, never within one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

import torch

from layerscope.hooks._steps import StepClock
from layerscope.stats import own_graph_count

# One function that dynamo runs eagerly, for every hook on a recorded step of compiled code:
# one function, not one per hook, so that dynamo compiles what follows its call once. Made
# once dynamo is loaded (making it loads dynamo: 2 s and 70 MB an uncompiled model should not
# pay), at the latest at the first compiled call, where making it is itself a graph break.
_EAGER: list[Callable[..., None]] = []
# The gates' code. Dynamo traces a gate inline where a compiled model calls it, but it would
# also compile each gate as a frame of its own, called from the eager parts of a recorded step,
# and recompile it for every module's closure until it gave up: told to skip those frames.
_GATE_CODES: set[CodeType] = set()


def _call(hook: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    hook(*args, **kwargs)


def _eager_call() -> Callable[..., None]:
    """``_call``, which dynamo never traces: a hook called through it runs eagerly."""
    if not _EAGER:
        _EAGER.append(torch.compiler.disable(_call))  # type: ignore[no-untyped-call]  # untyped in torch
        for code in _GATE_CODES:
            _skip_frames_of(code)
    return _EAGER[0]


def _gate_made(gate: Callable[..., None]) -> Callable[..., None]:
    code = gate.__code__
    if code not in _GATE_CODES:
        _GATE_CODES.add(code)
        if _EAGER:
            _skip_frames_of(code)
    return gate


def _skip_frames_of(code: CodeType) -> None:
    """Dynamo compiles no frame of ``code`` or of what it calls, and still traces it inline.

    A gate's frame of its own runs where compiled code calls it eagerly: its hook then runs
    eagerly too, as torch.compiler.disable would run it.
    """
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
    except ImportError:  # private to torch: without it, only more recompiles
        return
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


def prepare_for_dynamo() -> None:
    """Make the trampoline now if dynamo is loaded, before it traces any gate."""
    if not _EAGER and "torch._dynamo" in sys.modules:
        _eager_call()


def user_compiled_anything() -> bool:
    """Whether dynamo has compiled the user's code in this process.

    Hooks put on or taken off a compiled model make dynamo recompile, so once anything is
    compiled they stay. The statistics kernel's own graphs (torch's kernel where the C one
    is missing, and on accelerators) do not count.
    """
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo is not None and dynamo.counters["stats"]["unique_graphs"] > own_graph_count()


def gated(clock: StepClock, hook: Callable[..., None]) -> Callable[..., None]:
    """``hook`` (a watched module's) behind a gate: it runs on recorded or watched passes.

    The sentinel (``watching``) stays out of compiled code: it would break the graph every
    step.
    """

    def gate(*args: Any, **kwargs: Any) -> None:
        compiling = torch.compiler.is_compiling()
        # Under compile `not compiling` comes first: no guard on watching, no recompile.
        if clock.recording or (not compiling and clock.watching):
            if not compiling:  # the eager trampoline would only cost time here
                hook(*args, **kwargs)
                return
            _eager_call()(hook, *args, **kwargs)

    return _gate_made(gate)


def entry_gated(clock: StepClock, hook: Callable[..., None]) -> Callable[..., None]:
    """An entry hook: always run eagerly, and in compiled code only on recorded steps.

    Entries end skipped steps and begin passes, which unrecorded steps need too; their
    cost is one call where the model is entered, not one per module.
    """

    def gate(*args: Any, **kwargs: Any) -> None:
        if not torch.compiler.is_compiling():
            hook(*args, **kwargs)
        elif clock.recording:
            _eager_call()(hook, *args, **kwargs)

    return _gate_made(gate)
