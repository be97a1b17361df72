"""Which forward passes train, and the modules that they run in eval mode.

A pass under no_grad is evaluation. A pass with grad enabled in train mode is training. One in
eval mode is evaluation until the pass that a step's optimizer step follows (the last with a
backward pass before it) is one: ``model.eval()`` was never undone, and from then on passes in
eval mode train too, until the model is entered in train mode again. An adversarial example
made in eval mode by a backward pass before the step's own, in train mode, changes nothing.

BatchNorm in eval mode normalises with its running statistics instead of the batch's, and
Dropout drops nothing: in a training pass, that is training in the wrong mode. Other modules,
BatchNorm without running statistics and Dropout with p = 0 have no such difference. A pass's
modes are read as it begins (attribute reads, no sync); a step whose optimizer stepped tells
the scalar ``eval_mode/<module>`` of those its last backward pass ran in eval mode: 1 for a
module that trains so, 0 for one that is frozen as well (its parameters, or for one without,
its parent's, need no gradient: fine-tuning's frozen BatchNorm). A module is told again only
after it left eval mode, or when it becomes frozen or trainable.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from layerscope.health import EVAL_MODE_SCALAR
from layerscope.recording import Recorder

_MODAL = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
_Named = list[tuple[str, nn.Module]]


def _differs_in_eval(module: nn.Module) -> bool:
    """Whether eval mode changes what ``module`` computes."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return module.track_running_stats and module.running_mean is not None
    return isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0


def _trains(module: nn.Module) -> bool:
    return any(param.requires_grad for param in module.parameters())


class TrainModes:
    """The phase of each pass, and the BatchNorm and Dropout modules a training pass ran in eval.

    Args:
        root: the model.
        targets: the watched modules, by name.
        recorder: where the step's scalars go.
    """

    def __init__(
        self, root: nn.Module, targets: Sequence[tuple[str, nn.Module]], recorder: Recorder
    ) -> None:
        self._root = root
        self._modal = [(name, module) for name, module in targets if isinstance(module, _MODAL)]
        self._recorder = recorder
        self.trains_in_eval = False  # passes in eval mode with grad enabled train
        self._pass_in_eval = False  # the pass in progress began in eval mode with grad
        self._backward_in_eval = False  # so did the last pass that a backward pass ran through
        self._in_eval: _Named = []  # modal modules in eval mode as the pass in progress began
        # As the last pass with a backward pass in this step began; None: no backward pass.
        self._backward_modes: _Named | None = None
        self._told: dict[str, bool] = {}  # module -> frozen, as last told

    def pass_begins(self, entered: nn.Module, grad: bool) -> bool:
        """A pass enters the model at ``entered``: whether it trains."""
        if entered.training:
            self.trains_in_eval = False
        self._pass_in_eval = grad and not entered.training
        self._in_eval = [(n, m) for n, m in self._modal if not m.training] if grad else []
        return grad and (entered.training or self.trains_in_eval)

    def backward_ran(self) -> None:
        """A backward pass ran through the pass in progress."""
        self._backward_in_eval = self._pass_in_eval
        self._backward_modes = self._in_eval

    def step_ended(self, step: int, stepped: bool) -> None:
        """Step ``step`` ends; ``stepped``: an optimizer step applied its last backward pass."""
        if stepped and self._backward_modes is not None:
            self.trains_in_eval = self.trains_in_eval or self._backward_in_eval
            if self._backward_modes or self._told:
                self._tell(step, self._backward_modes)
        self._backward_in_eval = False
        self._backward_modes = None

    def _tell(self, step: int, in_eval: _Named) -> None:
        now = {name: not self._trains(name, m) for name, m in in_eval if _differs_in_eval(m)}
        scalars = {
            f"{EVAL_MODE_SCALAR}/{name}": 0.0 if frozen else 1.0
            for name, frozen in now.items()
            if self._told.get(name) != frozen
        }
        self._told = now
        if scalars:
            self._recorder.add_scalars(step, scalars)

    def _trains(self, name: str, module: nn.Module) -> bool:
        """Whether ``module``, or its parent for one without parameters, trains."""
        if next(module.parameters(recurse=False), None) is not None:
            return _trains(module)
        parent = name.rpartition(".")[0]
        return _trains(self._root.get_submodule(parent) if parent else self._root)
