"""One watch put together: ``Scope`` joins the stages, and reads back what they recorded.

``watch()`` builds a ``Scope`` from its configuration: the hooks on the training thread
(``layerscope.hooks``), the recorder (``layerscope.recording``), the writer thread and its
sinks (``layerscope.writer``), and the whole tensors' workers (``layerscope.tensors``).
``scope.step()`` moves the step clock; ``scope.frame()``, ``scope.run`` and ``animate`` read
what was recorded, from memory or from the run's store; closing the scope ends them all.
"""

from layerscope.scope._animate import animate
from layerscope.scope._scope import Scope

__all__ = ["Scope", "animate"]
