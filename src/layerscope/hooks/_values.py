"""Walking nested inputs and outputs to the tensors inside, with readable names."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from torch import Tensor

_MAX_DEPTH = 6  # deeper nesting is not a layer's output; it also guards against cycles


def named_tensors(value: object, prefix: str, depth: int = 0) -> Iterator[tuple[str, Tensor]]:
    """Tensors inside ``value`` with dotted names: ``out``, ``out.0``, ``out.logits``.

    Walks tuples and lists (by index), namedtuples and dataclasses (by field), mappings such as
    Hugging Face ``ModelOutput`` (by key); skips None and anything else. Every tensor is a leaf,
    whatever its kind: a nested tensor is not walked into its components, and a subclass
    (``Parameter``, ``DTensor``, a wrapper subclass) comes out as it is.

    Examples:
        >>> import torch
        >>> [name for name, _ in named_tensors((torch.ones(1), {"h": torch.ones(1)}), "out")]
        ['out.0', 'out.1.h']
    """
    if isinstance(value, Tensor):  # first: a tensor subclass may look like a container too
        yield prefix, value
        return
    if depth >= _MAX_DEPTH or value is None or isinstance(value, str | bytes | int | float):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from named_tensors(item, f"{prefix}.{key}", depth + 1)
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for field_name, item in zip(value._fields, value, strict=False):
            yield from named_tensors(item, f"{prefix}.{field_name}", depth + 1)
    elif isinstance(value, tuple | list):
        for index, item in enumerate(value):
            yield from named_tensors(item, f"{prefix}.{index}", depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from named_tensors(
                getattr(value, field.name), f"{prefix}.{field.name}", depth + 1
            )
