"""Seeing ``torch.nn.functional.scaled_dot_product_attention`` calls while a recorded step runs.

The function is replaced by a wrapper only while some scope wants to see its calls (a recorded
step of a watch with ``attention=True``): an unrecorded step calls torch's own function, with
no frame of ours. The wrapper calls torch's function first, with the arguments as given, and
hands its observers the call's arguments after; its result is returned untouched. Code that
took the function under another name before the patch (``from torch.nn.functional import
scaled_dot_product_attention``) calls torch's function directly and is not seen.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F  # torch's own spelling

_ORIGINAL = F.scaled_dot_product_attention
_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


class AttentionCall(NamedTuple):
    """What an attention call's probabilities depend on."""

    query: torch.Tensor
    key: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    enable_gqa: bool


Observer = Callable[[AttentionCall], None]
_observers: list[Observer] = []
_lock = threading.Lock()


def call_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AttentionCall:
    """The ``AttentionCall`` of arguments as ``scaled_dot_product_attention`` takes them."""
    given = dict(zip(_PARAMETERS, args, strict=False))
    given.update(kwargs)
    return AttentionCall(
        given["query"],
        given["key"],
        given.get("attn_mask"),
        bool(given.get("is_causal", False)),
        given.get("scale"),
        bool(given.get("enable_gqa", False)),
    )


@functools.wraps(_ORIGINAL)
def _seen_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
    output = _ORIGINAL(*args, **kwargs)
    if _observers and not torch.compiler.is_compiling():
        call = call_of(args, kwargs)
        for observer in list(_observers):
            observer(call)  # observers catch their own errors: training goes on
    return output


def observe_attention(observer: Observer) -> None:
    """Hand ``observer`` every attention call from now on, until ``stop_observing``."""
    with _lock:
        if observer not in _observers:
            _observers.append(observer)
        F.scaled_dot_product_attention = _seen_attention


def stop_observing(observer: Observer) -> None:
    """Stop handing ``observer`` calls; torch's function comes back when none is left."""
    with _lock:
        if observer in _observers:
            _observers.remove(observer)
        if not _observers and F.scaled_dot_product_attention is _seen_attention:
            F.scaled_dot_product_attention = _ORIGINAL


def patched() -> bool:
    """Whether the function is ours now."""
    return F.scaled_dot_product_attention is _seen_attention
