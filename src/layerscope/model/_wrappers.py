"""The model a person thinks of, inside the wrappers DDP, DataParallel and compile put around it."""

from __future__ import annotations

from torch import nn


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
