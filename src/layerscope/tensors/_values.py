"""What a record may hold besides a tensor: whatever ``stash`` or ``stash_value`` returned.

A tensor is kept as a compact detached copy; so is each tensor inside a tuple, a list
(namedtuples too), a dict (``ModelOutput`` and other mappings too) or a dataclass, the
containers rebuilt around the copies; a number, a string, None or any other object is kept as
it is. ``save()`` writes tensors into its safetensors files and everything else into
``capture.json`` as tagged JSON: numbers (NaN and infinities included), strings, None and
booleans, and tuples, lists, string-keyed dicts, namedtuples, dataclasses and string-keyed
mappings of them and of tensors. A namedtuple loads as a namedtuple of the same name and
fields; a dataclass or a mapping of another class as a ``SavedObject`` (no class is imported
on load: that would run code the files name). Another object cannot be saved (nothing is
pickled): ``save()`` says which record.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import keyword
import math
from collections.abc import Callable, Mapping, MutableMapping
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
    if isinstance(value, MutableMapping):  # a ModelOutput: its items, and so its attributes
        mapping = copy.copy(value)
        for key, item in value.items():
            mapping[key] = map_tensors(item, fn, depth + 1)
        return mapping
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        instance = copy.copy(value)
        for field in dataclasses.fields(value):
            item = map_tensors(getattr(value, field.name), fn, depth + 1)
            object.__setattr__(instance, field.name, item)  # frozen ones too
        return instance
    return value


class SavedObject(dict[str, Any]):
    """A saved dataclass or mapping, as ``load_capture`` reads it: fields as items and attributes.

    ``type_name`` is the qualified name of the class it was saved from.

    Examples:
        >>> saved = SavedObject("transformers.ModelOutput", {"logits": 1.5})
        >>> saved.logits, saved["logits"], saved.type_name
        (1.5, 1.5, 'transformers.ModelOutput')
    """

    __module__ = "layerscope.tensors"  # where users import it from

    def __init__(self, type_name: str, fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self.type_name = type_name

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{self.type_name} has no field {name!r}") from None

    def __repr__(self) -> str:
        return f"SavedObject({self.type_name!r}, {dict(self)!r})"


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
    if depth < MAX_DEPTH and isinstance(value, tuple) and hasattr(value, "_fields"):
        names = value._fields
        fields = {
            name: encode(item, keep_tensor, depth + 1)
            for name, item in zip(names, value, strict=True)
        }
        return {"namedtuple": {"type": type(value).__name__, "fields": fields}}
    if depth < MAX_DEPTH and isinstance(value, tuple | list):
        listed = [encode(item, keep_tensor, depth + 1) for item in value]
        return listed if isinstance(value, list) else {"tuple": listed}
    if depth < MAX_DEPTH and isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        items = {key: encode(item, keep_tensor, depth + 1) for key, item in value.items()}
        if type(value) is dict:
            return {"dict": items}
        return {"object": {"type": _qualified(value), "fields": items}}
    if depth < MAX_DEPTH and dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = {
            field.name: encode(getattr(value, field.name), keep_tensor, depth + 1)
            for field in dataclasses.fields(value)
        }
        return {"object": {"type": _qualified(value), "fields": items}}
    raise TypeError(
        f"a value of type {type(value).__name__} cannot be saved: saved values are tensors, "
        f"numbers, strings, None, and tuples, lists, str-keyed dicts and mappings, namedtuples "
        f"and dataclasses of them"
    )


def _qualified(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def uses_objects(encoded: Any, depth: int = 0) -> bool:
    """Whether ``encode``'s output holds a namedtuple or an object (older readers cannot)."""
    if depth > 2 * MAX_DEPTH + 2:
        return False
    if isinstance(encoded, list):
        return any(uses_objects(item, depth + 1) for item in encoded)
    if not isinstance(encoded, dict):
        return False
    if "namedtuple" in encoded or "object" in encoded:
        return True
    return any(uses_objects(item, depth + 1) for item in encoded.values())


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
    if "namedtuple" in encoded:
        saved = encoded["namedtuple"]
        fields = {key: decode(item, tensor) for key, item in saved["fields"].items()}
        name = str(saved["type"])
        name = name if name.isidentifier() and not keyword.iskeyword(name) else "SavedTuple"
        return collections.namedtuple(name, list(fields), rename=True)(*fields.values())
    if "object" in encoded:
        saved = encoded["object"]
        fields = {key: decode(item, tensor) for key, item in saved["fields"].items()}
        return SavedObject(str(saved["type"]), fields)
    if "float" in encoded:
        return float(encoded["float"])
    return tensor(encoded)
