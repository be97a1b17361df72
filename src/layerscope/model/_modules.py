"""The module tree and the call order of one recorded step."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

# Name segments that wrappers insert; they are dropped from the names a person sees.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """One module of the tree: its type, its own parameters and its children."""

    name: str  # qualified name as in named_modules(), "" for the root
    type: str  # class name
    parameters: dict[str, tuple[int, ...]]  # its own parameters: name -> shape
    num_parameters: int  # elements in its own parameters
    num_parameters_total: int  # elements in its parameters and its descendants', each once
    children: tuple[str, ...]  # qualified names of its direct children
    watched: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out = asdict(self)
        out["parameters"] = {name: list(shape) for name, shape in self.parameters.items()}
        out["children"] = list(self.children)
        return out


@dataclass(frozen=True, slots=True)
class CallEvent:
    """A module entering or leaving its forward during a recorded step's first training pass."""

    step: int
    seq: int
    event: str  # "enter" or "exit"
    module: str
    call: int


def module_tree(model: nn.Module, watched: Collection[str]) -> list[ModuleInfo]:
    """Every module of ``model`` in ``named_modules()`` order (shared modules once)."""
    tree = []
    for raw_name, module in model.named_modules():
        name = clean_name(raw_name)
        own = dict(module.named_parameters(recurse=False))
        unique = {id(p): p.numel() for p in module.parameters()}
        children = tuple(
            clean_name(f"{raw_name}.{child}" if raw_name else child)
            for child, _ in module.named_children()
        )
        tree.append(
            ModuleInfo(
                name=name,
                type=type(module).__name__,
                parameters={key: tuple(p.shape) for key, p in own.items()},
                num_parameters=sum(p.numel() for p in own.values()),
                num_parameters_total=sum(unique.values()),
                children=children,
                watched=name in watched,
            )
        )
    return tree


def clean_name(name: str) -> str:
    """``named_modules()`` name without the segments wrappers insert."""
    if not any(segment in name for segment in _WRAPPER_SEGMENTS):
        return name
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)
