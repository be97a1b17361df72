"""What a record may hold besides a tensor: whatever ``stash`` or ``stash_value`` returned.

A tensor is kept as a compact detached copy; so is each tensor inside a tuple, a list
(namedtuples too) or a dict, the containers rebuilt around the copies; a number, a string,
None or any other object is kept as it is. ``save()`` writes tensors into its safetensors
files and everything else into ``capture.json`` as tagged JSON: numbers (NaN and infinities
included), strings, None and booleans, and tuples, lists and string-keyed dicts of them and of
tensors. Another object cannot be saved (nothing is pickled): ``save()`` says which record.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from layerscope.tensors._records import kept_bytes, kept_copy

# How deep containers are walked: a value nested deeper is kept as it is.
MAX_DEPTH = 32


def map_tensors(value: Any, fn: Callable[[Tensor], Any], depth: int = 0) -> Any:
    """``value`` with ``fn`` applied to every tensor in it, its containers rebuilt."""
    if isinstance(value, Tensor):
        return fn(value)
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, tuple) and hasattr(value, "_make"):  # a namedtuple
        return value._make(map_tensors(item, fn, depth + 1) for item in value)
    if type(value) in (tuple, list):
        return type(value)(map_tensors(item, fn, depth + 1) for item in value)
    if type(value) is dict:
        return {key: map_tensors(item, fn, depth + 1) for key, item in value.items()}
    return value


def tensors_in(value: Any, depth: int = 0) -> list[Tensor]:
    """The tensors ``map_tensors`` would reach in ``value``, in order."""
    found: list[Tensor] = []
    map_tensors(value, lambda tensor: found.append(tensor), depth)
    return found


def kept_value(value: Any, device: torch.device | None) -> Any:
    """``value`` with each tensor in it a compact detached copy on ``device``."""
    return map_tensors(value, lambda tensor: kept_copy(tensor, device))


def detached(value: Any) -> Any:
    """``value`` with each tensor in it detached (no copy)."""
    return map_tensors(value, lambda tensor: tensor.detach())


def value_size(value: Any) -> int:
    """Bytes the tensors in ``value`` will hold once copied (other objects count 0)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors_in(value))


def value_bytes(value: Any) -> int:
    """Bytes of memory the tensors in ``value`` keep: their whole storages."""
    return sum(kept_bytes(tensor) for tensor in tensors_in(value))


def first_value(value: Any) -> Any:
    """The first element of nested tuples and lists, or first value of a dict, else ``value``.

    As tensor_tracker's ``first_value``.
    """
    for _ in range(MAX_DEPTH):
        if isinstance(value, tuple | list) and value:
            value = value[0]
        elif isinstance(value, dict) and value:
            value = next(iter(value.values()))
        else:
            break
    return value


def encode(value: Any, keep_tensor: Callable[[Tensor], dict[str, Any]], depth: int = 0) -> Any:
    """``value`` as JSON; each tensor becomes what ``keep_tensor`` returns (where it is saved).

    Raises:
        TypeError: ``value`` holds an object other than those the module docstring lists.
    """
    if isinstance(value, Tensor):
        return keep_tensor(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}  # 'nan', 'inf', '-inf'
    if depth < MAX_DEPTH and isinstance(value, tuple | list):
        items = [encode(item, keep_tensor, depth + 1) for item in value]
        return items if isinstance(value, list) else {"tuple": items}
    if depth < MAX_DEPTH and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {key: encode(item, keep_tensor, depth + 1) for key, item in value.items()}}
    raise TypeError(
        f"a value of type {type(value).__name__} cannot be saved: saved values are tensors, "
        f"numbers, strings, None, and tuples, lists and str-keyed dicts of them"
    )


def decode(encoded: Any, tensor: Callable[[dict[str, Any]], Tensor]) -> Any:
    """The value ``encode`` wrote; ``tensor(reference)`` reads back each tensor."""
    if isinstance(encoded, list):
        return [decode(item, tensor) for item in encoded]
    if not isinstance(encoded, dict):
        return encoded
    if "tuple" in encoded:
        return tuple(decode(item, tensor) for item in encoded["tuple"])
    if "dict" in encoded:
        return {key: decode(item, tensor) for key, item in encoded["dict"].items()}
    if "float" in encoded:
        return float(encoded["float"])
    return tensor(encoded)
