"""What ``include=`` and ``exclude=`` take: regexes, predicates and module objects.

Each item tells how it meets a module of the model: ``WHOLE`` (it means that module itself,
whatever it is), ``INSIDE`` (the module lies within what it means, so the default rule decides
whether it is watched) or ``NONE``.

- a regex (a string or a compiled pattern): ``WHOLE`` where it matches the whole clean name
  (``re.fullmatch``), ``INSIDE`` where it is found in it (``re.search``);
- a callable ``fn(name, module)``: ``WHOLE`` where it returns a true value. It is called once
  per module, at ``watch()`` or ``capture()``, never while training;
- a module object, by identity (its name does not matter, wrappers neither): ``WHOLE`` for
  itself, ``INSIDE`` for the modules within it. It must be a module of the model.

``Selection`` (``_select.py``) combines an include's and an exclude's items with ``types``.
"""

from __future__ import annotations

import inspect
import re
import reprlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import TypeAlias

from torch import nn

from layerscope.model._modules import clean_name
from layerscope.model._wrappers import unwrap

# What include= and exclude= take: one of these, or a list of them.
ModuleFilter: TypeAlias = str | re.Pattern[str] | nn.Module | Callable[[str, nn.Module], object]
ACCEPTED = (
    "a regex string, a compiled pattern, a module of the model, a callable "
    "fn(name, module) -> bool, or a list of them"
)


class Match(IntEnum):
    """How an item meets a module; the larger wins."""

    NONE = 0
    INSIDE = 1  # within what the item names: the default rule (or types=) decides
    WHOLE = 2  # the item means this module itself, whatever it is


@dataclass(frozen=True, slots=True)
class _Regex:
    pattern: re.Pattern[str]

    def match(self, name: str, module: nn.Module) -> Match:
        if self.pattern.fullmatch(name):
            return Match.WHOLE
        return Match.INSIDE if self.pattern.search(name) else Match.NONE

    def text(self) -> str:
        return self.pattern.pattern


@dataclass(frozen=True, slots=True)
class _Predicate:
    function: Callable[[str, nn.Module], object]
    argument: str

    def match(self, name: str, module: nn.Module) -> Match:
        try:
            return Match.WHOLE if self.function(name, module) else Match.NONE
        except Exception as error:  # the user's code: say where, keep the cause chained
            raise ValueError(
                f"{self.argument}: {self.text()} raised {type(error).__name__} for module "
                f"{name!r}: {error}"
            ) from error

    def text(self) -> str:
        name = getattr(self.function, "__name__", None)
        if not isinstance(name, str):  # a functools.partial, an instance with __call__
            name = type(self.function).__name__
        return f"<callable {'lambda' if name == '<lambda>' else name}>"


@dataclass(frozen=True, slots=True)
class _ModuleItem:
    # Weak: a config or a closed capture kept around does not keep the model's layers alive.
    module: weakref.ref[nn.Module]
    type_name: str
    name: str | None = None  # its clean name in the model, once bound
    inside: frozenset[int] = frozenset()  # ids of itself and the modules within it, once bound

    def match(self, name: str, module: nn.Module) -> Match:
        if id(module) not in self.inside:
            return Match.NONE
        return Match.WHOLE if module is self.module() else Match.INSIDE

    def text(self) -> str:
        if self.name is None:
            return f"<module (a {self.type_name})>"
        return f"<module {self.name or '(root)'}>"


_Item: TypeAlias = _Regex | _Predicate | _ModuleItem


@dataclass(frozen=True, slots=True)
class Rules:
    """The items of ``include=`` or ``exclude=``; empty (false) when the argument was None."""

    argument: str
    items: tuple[_Item, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.items)

    def match(self, name: str, module: nn.Module) -> Match:
        """The best match of any item with the module called ``name``."""
        best = Match.NONE
        for item in self.items:
            best = max(best, item.match(name, module))
            if best is Match.WHOLE:
                break
        return best

    def bind(self, root: nn.Module) -> Rules:
        """The rules with their module objects found in ``root``: names, and what is within.

        Raises:
            ValueError: a module object is not one of ``root``'s modules.
        """
        if not any(isinstance(item, _ModuleItem) for item in self.items):
            return self
        names: dict[int, str] = {}
        for raw_name, module in root.named_modules():
            names.setdefault(id(module), clean_name(raw_name))
        bound: list[_Item] = []
        for item in self.items:
            if isinstance(item, _ModuleItem):
                module = item.module()
                if module is None or id(module) not in names:
                    raise ValueError(
                        f"{self.argument}: the {item.type_name} module given is not part of "
                        f"the model; pass the watched model's own modules (model.encoder), "
                        f"not a copy's"
                    )
                inside = frozenset(id(child) for child in module.modules())
                item = replace(item, name=names[id(module)], inside=inside)
            bound.append(item)
        return replace(self, items=tuple(bound))

    def texts(self) -> list[str]:
        """Readable, JSON-ready texts: a regex's pattern, ``<callable f>``, ``<module name>``."""
        return [item.text() for item in self.items]


def parse_rules(value: object, argument: str, root: nn.Module | None = None) -> Rules:
    """``include`` / ``exclude``: one item or a list of them, or None; see the module's doc.

    With ``root``, module objects are found in it now (else when the selection is made).

    Raises:
        TypeError: an item of another type, or a callable that cannot take (name, module).
        ValueError: a bad regex, or a module object that is not part of ``root``.
    """
    if value is None:
        return Rules(argument)
    single = isinstance(value, str | re.Pattern | nn.Module | type) or callable(value)
    items: object = [value] if single else value
    if not isinstance(items, Sequence):
        raise TypeError(f"{argument}: expected {ACCEPTED}; got {type(value).__name__}")
    rules = Rules(argument, tuple(_item(item, argument) for item in items))
    return rules if root is None else rules.bind(root)


def _item(item: object, argument: str) -> _Item:
    if isinstance(item, re.Pattern):
        return _Regex(item)
    if isinstance(item, str):
        try:
            return _Regex(re.compile(item))
        except re.error as error:
            raise ValueError(f"{argument}: invalid regex {item!r}: {error}") from None
    if isinstance(item, type):  # a class is callable, but not a filter: types= takes classes
        raise TypeError(
            f"{argument}: got the class {item.__name__}; pass types=({item.__name__},) to "
            f"watch modules of a class, or a module object"
        )
    if isinstance(item, nn.Module):  # before callable(): a module is callable too
        module = unwrap(item)
        return _ModuleItem(weakref.ref(module), type(module).__name__)
    if callable(item):
        _check_signature(item, argument)
        return _Predicate(item, argument)
    raise TypeError(
        f"{argument}: expected {ACCEPTED}; got {reprlib.repr(item)} ({type(item).__name__})"
    )


def _check_signature(function: Callable[..., object], argument: str) -> None:
    """A callable that cannot be called as ``fn(name, module)`` fails now, not mid-selection."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    try:
        signature.bind("name", nn.Identity())
    except TypeError:
        raise TypeError(
            f"{argument}: a callable is called as fn(name, module) and returns True for the "
            f"modules to pick; got one with signature {signature}"
        ) from None
