"""layerscope: see inside every layer of a PyTorch model while it trains.

The package's face: ``watch`` and the ``Scope`` it returns, ``Schedule``, ``capture``, the
readers of stored runs (``load``, ``runs``, ``Run``) and the errors it raises. Each is imported
when first used, so reading a run (``layerscope summary``) never imports torch. The stages
behind the face are packages of their own; ``docs/architecture.md`` draws them.

Examples:
    >>> import torch, layerscope
    >>> model = torch.nn.Linear(4, 2)
    >>> with layerscope.watch(model, every=1) as scope:
    ...     model(torch.randn(8, 4)).sum().backward()
    ...     scope.step()
    >>> scope.frame()[["step", "module", "kind", "tensor"]].head(3)
       step module         kind  tensor
    0     0          activation     out
    1     0                grad     out
    2     0         weight_grad  weight
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope._errors import LayerscopeWarning, NonFiniteError
from layerscope._lazy import lazy_names
from layerscope._version import __version__

if TYPE_CHECKING:
    from layerscope import health, sinks, stats, store, tensors
    from layerscope._schedule import Schedule
    from layerscope._watch import watch
    from layerscope.model import CallEvent, Kind, ModuleInfo
    from layerscope.scope import Scope, animate
    from layerscope.store import Run, load, precision, runs
    from layerscope.tensors import capture, load_capture

# Each public name and the module that defines it, imported on first use.
_HOMES = {
    "CallEvent": "layerscope.model",
    "Kind": "layerscope.model",
    "ModuleInfo": "layerscope.model",
    "Run": "layerscope.store",
    "Schedule": "layerscope._schedule",
    "Scope": "layerscope.scope",
    "animate": "layerscope.scope",
    "capture": "layerscope.tensors",
    "load": "layerscope.store",
    "load_capture": "layerscope.tensors",
    "precision": "layerscope.store",
    "runs": "layerscope.store",
    "watch": "layerscope._watch",
    **{name: f"layerscope.{name}" for name in ("health", "sinks", "stats", "store", "tensors")},
}
__getattr__ = lazy_names(__name__, _HOMES)

__all__ = [
    "CallEvent",
    "Kind",
    "LayerscopeWarning",
    "ModuleInfo",
    "NonFiniteError",
    "Run",
    "Schedule",
    "Scope",
    "__version__",
    "animate",
    "capture",
    "health",
    "load",
    "load_capture",
    "precision",
    "runs",
    "sinks",
    "stats",
    "store",
    "tensors",
    "watch",
]


def __dir__() -> list[str]:
    return sorted(__all__)
