"""``accumulating_grad``: an optimizer step that applied a gradient still holding the last one's.

The training thread watches one parameter's ``.grad`` across optimizer steps (the first
trainable parameter of the watched modules that the first optimizer steps) and gives a step
the scalar ``grad_carried`` where backward added to the gradient the previous step applied,
uncleared: ``zero_grad()`` is missing. Its value is the largest magnitude carried over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from layerscope.health._alert import Alert

#: The scalar a step gets where its optimizer applied a gradient carried from the last step.
CARRIED_SCALAR = "grad_carried"
#: Steps with no carried gradient that end an episode: one alert for a loop that lost it.
_QUIET = 20


def accumulation_probe(
    targets: Sequence[tuple[str, nn.Module]], optimizers: Sequence[torch.optim.Optimizer]
) -> tuple[str, str, Tensor] | None:
    """The parameter whose gradient is watched: ``(module, name, parameter)``, or None.

    The first of the watched modules' own parameters that needs a gradient and that the first
    optimizer steps; None without an optimizer or such a parameter.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> model[0].requires_grad_(False)
        Linear(in_features=2, out_features=2, bias=True)
        >>> sgd = torch.optim.SGD(model[1].parameters(), lr=0.1)
        >>> accumulation_probe(list(model.named_children()), [sgd])[:2]
        ('1', 'weight')
    """
    if not optimizers:
        return None
    stepped = {id(param) for group in optimizers[0].param_groups for param in group["params"]}
    for module_name, module in targets:
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad and id(param) in stepped:
                return module_name, name, param
    return None


class AccumulatingGrad:
    """Optimizer steps that applied a gradient carried over from the step before.

    One warning per episode; an episode ends after 20 steps with none. The rule reads the
    scalar ``grad_carried`` that ``watch(optimizer=...)`` gives such a step, of the parameter
    ``probe`` names (module, parameter name); it has no options.
    """

    name = "accumulating_grad"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, probe: tuple[str, str] | None = None) -> None:
        self._module, self._tensor = probe if probe is not None else ("", "")
        self._last: int | None = None  # the last step seen with a carried gradient

    def observe_scalars(self, scalars: Sequence[tuple[int, str, float]]) -> list[Alert]:
        """The alerts of a flush's scalars."""
        alerts = []
        for step, name, value in scalars:
            if name != CARRIED_SCALAR or not value > 0:  # zero: cleared through .data
                continue
            opens = self._last is None or step > self._last + _QUIET
            self._last = step if self._last is None else max(self._last, step)
            if opens:
                alerts.append(self._alert(step, value))
        return alerts

    def _alert(self, step: int, value: float) -> Alert:
        where = ".".join(part for part in (self._module, self._tensor) if part) or "a parameter"
        return Alert(
            step=step,
            phase="train",
            rule=self.name,
            module=self._module,
            kind="weight_grad",
            tensor=self._tensor,
            severity="warning",
            value=value,
            threshold=0.0,
            message=(
                f"the gradient of {where} that the optimizer applied at step {step} still "
                f"held the one it applied at the step before (largest magnitude carried over "
                f"{value:.3g}, where zero_grad() leaves 0 or None): gradients are summed over "
                f"steps; call optimizer.zero_grad() after each optimizer.step() (to "
                f"accumulate micro-batches, step and clear only at each window's end)"
            ),
        )
