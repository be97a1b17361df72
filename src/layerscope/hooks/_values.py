"""Walking nested inputs and outputs to the tensors inside, with readable names.

Outputs are ``out``, ``out.0``, ``out.logits``. Inputs are named as the module's ``forward``
names them: ``in.x`` for ``forward(self, x)`` (``InputNames`` binds positions to names once,
from the signature).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor, nn

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


class InputNames:
    """How one module's ``forward`` names its inputs, read from its signature once.

    A positional argument takes its parameter's name (``in.x``), a keyword argument its
    keyword (``in.mask``), and tensors nested inside either the names ``named_tensors`` gives
    (``in.x.0``, ``in.batch.ids``). An argument no named parameter takes keeps its position
    (``in.2``): one that only ``*args`` catches, and every argument of a forward whose
    signature cannot be read (a builtin, a traced ``torch.jit`` module).

    Examples:
        >>> import torch
        >>> names = InputNames(torch.nn.Linear(2, 2))
        >>> [name for name, _ in names.named((torch.ones(1, 2),), {})]
        ['in.input']
    """

    __slots__ = ("_positional",)

    def __init__(self, module: nn.Module) -> None:
        self._positional = _positional_names(module.forward)

    @staticmethod
    def cache() -> Callable[[nn.Module], InputNames]:
        """A maker of ``InputNames`` that reads each ``forward`` function's signature once."""
        made: dict[object, InputNames] = {}

        def names(module: nn.Module) -> InputNames:
            forward = module.forward
            key = getattr(forward, "__func__", forward)  # a method: its class's function
            if key not in made:
                made[key] = InputNames(module)
            return made[key]

        return names

    def name_at(self, index: int) -> str:
        """The name of the positional argument at ``index``: its parameter's, or the index."""
        positional = self._positional
        return positional[index] if index < len(positional) else str(index)

    def named(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
    ) -> Iterator[tuple[str, Tensor]]:
        """The tensors among a call's arguments, each with its name."""
        for index, value in enumerate(args):
            # depth 1: as deep as when the arguments were walked as one tuple
            yield from named_tensors(value, f"in.{self.name_at(index)}", 1)
        for key, value in (kwargs or {}).items():
            yield from named_tensors(value, f"in.{key}", 1)


def _positional_names(forward: Callable[..., Any]) -> tuple[str, ...]:
    """Names of the parameters that take positional arguments, in order; () if unreadable."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):  # a builtin, a ScriptMethod of a traced module
        return ()
    taking = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = []
    for parameter in parameters:
        if parameter.kind not in taking:
            break  # *args and after: no name for a position
        names.append(parameter.name)
    return tuple(names)
