"""Which modules to watch: names, regexes, types, and the unwrapping of wrapped models."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from torch import nn

from layerscope.model._modules import clean_name

# Pure containers: their output is a child's output, or they have no forward at all.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def unwrap(model: nn.Module) -> nn.Module:
    """The module a person thinks of: inside DDP, DataParallel and ``torch.compile``."""
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(inner, nn.Module):
            model = inner
            continue
        wrapped = getattr(model, "module", None)
        if isinstance(wrapped, nn.Module) and type(model).__name__ in (
            "DistributedDataParallel",
            "DataParallel",
        ):
            model = wrapped
            continue
        return model


def is_compiled(model: nn.Module, root: nn.Module) -> bool:
    """Whether ``model`` is compiled: ``torch.compile(model)`` or ``model.compile()``."""
    wrapper: object = model
    for _ in range(8):  # torch.compile's OptimizedModule may sit inside DDP or outside it
        if wrapper is root or not isinstance(wrapper, nn.Module):
            break
        if isinstance(getattr(wrapper, "_orig_mod", None), nn.Module):
            return True
        wrapper = getattr(wrapper, "module", None)
    return getattr(root, "_compiled_call_impl", None) is not None


def compile_patterns(value: object, argument: str) -> tuple[re.Pattern[str], ...]:
    """``include`` / ``exclude``: a regex string, a compiled pattern, a list of them, or None."""
    if value is None:
        return ()
    items: Sequence[object] = [value] if isinstance(value, str | re.Pattern) else value  # type: ignore[assignment]  # checked below
    if not isinstance(items, Sequence):
        raise TypeError(f"{argument}: expected a regex string or a list of them, got {value!r}")
    patterns = []
    for item in items:
        if isinstance(item, re.Pattern):
            patterns.append(item)
        elif isinstance(item, str):
            try:
                patterns.append(re.compile(item))
            except re.error as error:
                raise ValueError(f"{argument}: invalid regex {item!r}: {error}") from None
        else:
            raise TypeError(f"{argument}: expected a regex string, got {item!r}")
    return tuple(patterns)


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

    include: tuple[re.Pattern[str], ...] = ()
    exclude: tuple[re.Pattern[str], ...] = ()
    types: tuple[type[nn.Module], ...] | None = None

    def picks(self, name: str, module: nn.Module) -> bool:
        """Whether the module called ``name`` is watched."""
        if any(pattern.search(name) for pattern in self.exclude):
            return False
        if self.include:
            if any(pattern.fullmatch(name) for pattern in self.include):
                # Named whole: picked even if it is a container or only has children.
                return self.types is None or isinstance(module, self.types)
            if not any(pattern.search(name) for pattern in self.include):
                return False
        if self.types is not None:
            return isinstance(module, self.types)
        if isinstance(module, _CONTAINERS):
            return False  # its output is a child's output, or it has no forward at all
        owns_parameters = next(module.parameters(recurse=False), None) is not None
        has_children = next(module.children(), None) is not None
        return owns_parameters or not has_children


def select(model: nn.Module, selection: Selection) -> Iterator[tuple[str, nn.Module]]:
    """Watched modules of ``model`` in ``named_modules()`` order, with clean names.

    By default every module that owns parameters or has no children, but no pure container
    (Sequential, ModuleList, ModuleDict). ``include`` / ``exclude`` patterns are searched
    (``re.search``) in qualified names; an ``include`` pattern that matches a whole name picks
    that module whatever it is (``"^$"`` the root, ``"encoder"`` a block). ``types`` keeps only
    modules of those classes.
    """
    for raw_name, module in model.named_modules():
        name = clean_name(raw_name)
        if selection.picks(name, module):
            yield name, module


def selected(model: nn.Module, selection: Selection) -> list[tuple[str, nn.Module]]:
    """``select``'s modules, at least one: a ValueError says which arguments chose none."""
    targets = list(select(model, selection))
    if not targets:
        raise ValueError(
            f"no module selected: include={pattern_texts(selection.include)}, "
            f"exclude={pattern_texts(selection.exclude)}, types={selection.types}"
        )
    return targets


def device_type(model: nn.Module) -> str:
    """The model's device type: an accelerator's where any tensor is on one, else "cpu"."""
    tensors = [*model.parameters(), *model.buffers()]
    accelerators = sorted({t.device.type for t in tensors} - {"cpu", "meta"})
    return accelerators[0] if accelerators else "cpu"


def pattern_texts(patterns: Sequence[re.Pattern[str]]) -> list[str]:
    """The regexes' texts, for messages."""
    return [pattern.pattern for pattern in patterns]
