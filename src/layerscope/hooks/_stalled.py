"""Why a watched parameter cannot learn at a step, read from the model and its optimizers.

Read on recorded steps, when the optimizer's step has ended its training step, from Python
attributes only (``requires_grad``, ``grad is None``, the parameter groups and their learning
rates, the module at each watched name): no tensor's value, so no host sync. The health rule
``update_ratio`` reads the answers: a parameter that stops learning mid-run is named with the
reason, one that never learned from the start (a frozen backbone, an unused branch) is not a
finding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

# The reasons, in the order they are told: the first that holds is the parameter's.
REPLACED = "replaced"  # the module at its name is another one now, whose parameters are stepped
REPLACED_LEFT_OUT = "replaced_left_out"  # ... whose parameters no optimizer steps
FROZEN = "frozen"  # requires_grad is False
NO_GRADIENT = "no_gradient"  # it needs one, but backward left none (not used this step)
NO_GROUP = "no_group"  # it has a gradient, and no optimizer group holds it
ZERO_LR = "zero_lr"  # every group that holds it has a learning rate of 0


def stalled_parameters(
    root: nn.Module,
    targets: Sequence[tuple[str, nn.Module]],
    optimizers: Sequence[torch.optim.Optimizer],
) -> dict[tuple[str, str], str]:
    """The reason each watched module's own parameter cannot learn now, by (module, tensor).

    Parameters that can learn are left out.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model[0].bias.requires_grad_(False)
        Parameter containing:...
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> stalled_parameters(model, [("0", model[0])], [sgd])
        {('0', 'bias'): 'frozen'}
    """
    rates: dict[int, list[object]] = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                rates.setdefault(id(param), []).append(group.get("lr"))
    found: dict[tuple[str, str], str] = {}
    for name, module in targets:
        replaced = _module_at(root, name)
        for tensor, param in module.named_parameters(recurse=False):
            if replaced is not None and replaced is not module:
                stepped = all(id(p) in rates for p in replaced.parameters() if p.requires_grad)
                found[(name, tensor)] = REPLACED if stepped else REPLACED_LEFT_OUT
            else:
                reason = _reason(param, rates)
                if reason is not None:
                    found[(name, tensor)] = reason
    return found


def _reason(param: Tensor, rates: dict[int, list[object]]) -> str | None:
    if not param.requires_grad:
        return FROZEN
    if param.grad is None:
        return NO_GRADIENT
    held = rates.get(id(param))
    if held is None:
        return NO_GROUP
    # A learning rate held in a tensor is not read: that would wait for its device.
    if all(isinstance(lr, int | float) and lr == 0 for lr in held):
        return ZERO_LR
    return None


def _module_at(root: nn.Module, name: str) -> nn.Module | None:
    """The module at ``name`` in ``root`` now; None where there is none (or it is the root)."""
    if not name:
        return None
    try:
        return root.get_submodule(name)
    except AttributeError:
        return None
