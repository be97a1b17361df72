"""layerscope: see inside every layer of a PyTorch model while it trains.

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

from layerscope import health, sinks, stats, store, tensors
from layerscope._animate import animate
from layerscope._errors import LayerscopeWarning, NonFiniteError
from layerscope._kinds import Kind
from layerscope._modules import CallEvent, ModuleInfo
from layerscope._schedule import Schedule
from layerscope._scope import Scope
from layerscope._version import __version__
from layerscope._watch import watch
from layerscope.store import Run, load, runs
from layerscope.tensors import capture, load_capture

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
    "runs",
    "sinks",
    "stats",
    "store",
    "tensors",
    "watch",
]
