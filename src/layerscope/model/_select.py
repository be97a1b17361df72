"""Which modules to watch: ``include`` and ``exclude`` rules, ``types``, and the default rule."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from torch import nn

from layerscope.model._modules import clean_name
from layerscope.model._rules import Match, Rules

# Pure containers: their output is a child's output, or they have no forward at all.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def check_types(types: object) -> tuple[type[nn.Module], ...] | None:
    """``types``: a module class or a tuple of them, or None."""
    if types is None:
        return None
    classes = (types,) if isinstance(types, type) else types
    if not isinstance(classes, tuple | list) or not classes:
        raise TypeError(f"types: expected a tuple of nn.Module subclasses, got {types!r}")
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"types: expected nn.Module subclasses, got {cls!r}")
    return tuple(classes)


@dataclass(frozen=True, slots=True)
class Selection:
    """The rule that picks modules; see ``select``."""

    include: Rules = field(default_factory=lambda: Rules("include"))
    exclude: Rules = field(default_factory=lambda: Rules("exclude"))
    types: tuple[type[nn.Module], ...] | None = None

    def bind(self, root: nn.Module) -> Selection:
        """The selection with its module objects found in ``root`` (a ValueError if not)."""
        return replace(self, include=self.include.bind(root), exclude=self.exclude.bind(root))

    def picks(self, name: str, module: nn.Module) -> bool:
        """Whether the module called ``name`` is watched (module objects must be bound)."""
        if self.exclude.match(name, module) is not Match.NONE:
            return False
        if self.include:
            found = self.include.match(name, module)
            if found is Match.WHOLE:
                # Meant itself: picked even if it is a container or only has children.
                return self.types is None or isinstance(module, self.types)
            if found is Match.NONE:
                return False
        if self.types is not None:
            return isinstance(module, self.types)
        if isinstance(module, _CONTAINERS):
            return False  # its output is a child's output, or it has no forward at all
        owns_parameters = next(module.parameters(recurse=False), None) is not None
        has_children = next(module.children(), None) is not None
        return owns_parameters or not has_children

    def texts(self) -> dict[str, list[str]]:
        """``include``, ``exclude`` and ``types`` as readable, JSON-ready lists of text."""
        return {
            "include": self.include.texts(),
            "exclude": self.exclude.texts(),
            "types": [cls.__name__ for cls in self.types or ()],
        }


def select(model: nn.Module, selection: Selection) -> Iterator[tuple[str, nn.Module]]:
    """Watched modules of ``model`` in ``named_modules()`` order, with clean names.

    By default every module that owns parameters or has no children, but no pure container
    (Sequential, ModuleList, ModuleDict). ``include`` and ``exclude`` take regexes, callables
    ``fn(name, module)`` and module objects, alone or in a list (``_rules.py``). An excluded
    module is one that any ``exclude`` item meets: a regex found in its name, a callable that
    returns true, a module object that is it or holds it. Else, where ``include`` is given, a
    module that an item means whole is picked whatever it is (a regex matching the whole
    name: ``"^$"`` the root, ``"encoder"`` a block; a callable returning true; the module
    object itself); a module that an item only lies around (a regex found in its name, a
    module object holding it) is picked by the default rule; the others are not. ``types``
    keeps only modules of those classes. Callables are called here, once per module: at
    ``watch()`` or ``capture()``, never in a hook.

    Raises:
        ValueError: a module object that is not part of ``model``, or a callable that raised.
    """
    bound = selection.bind(model)
    for raw_name, module in model.named_modules():
        name = clean_name(raw_name)
        if bound.picks(name, module):
            yield name, module


def selected(model: nn.Module, selection: Selection) -> list[tuple[str, nn.Module]]:
    """``select``'s modules, at least one: a ValueError says which arguments chose none."""
    targets = list(select(model, selection))
    if not targets:
        texts = selection.texts()
        raise ValueError(
            f"no module selected: include={texts['include']}, exclude={texts['exclude']}, "
            f"types={selection.types}"
        )
    return targets


def device_type(model: nn.Module) -> str:
    """The model's device type: an accelerator's where any tensor is on one, else "cpu"."""
    tensors = [*model.parameters(), *model.buffers()]
    accelerators = sorted({t.device.type for t in tensors} - {"cpu", "meta"})
    return accelerators[0] if accelerators else "cpu"
