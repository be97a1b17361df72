"""``dead_units``: a statistic of how many units of an output are zero for the whole batch."""

from __future__ import annotations

import torch
from torch import Tensor


def dead_units(tensor: Tensor) -> Tensor:
    """The fraction of ``tensor``'s units that are exactly zero for every sample of the batch.

    A unit is a feature (the last dimension) of a 2-D or 3-D output, (batch, features) or
    (batch, sequence, features), and a channel (dimension 1) of a 4-D or 5-D one, (batch,
    channels, ...). A dying ReLU layer shows here before its zero fraction nears 1: half its
    units may be dead while the others fire half the time. Other shapes give 0.

    Pass it as a custom statistic, ``watch(model, stats={"dead_units": dead_units})``: the
    ``dead`` rule then also alerts when ``units`` of an output's units are dead. It costs one
    more pass over each recorded tensor, on its device, with no host sync.

    Examples:
        >>> x = torch.tensor([[0.0, 1.0, 0.0], [0.0, 2.0, 3.0]])  # unit 0 never fires
        >>> round(float(dead_units(x)), 4)
        0.3333
    """
    with torch.no_grad():
        if tensor.dim() in (2, 3):
            fires = tensor.reshape(-1, tensor.shape[-1]) != 0
            alive = fires.any(dim=0)
        elif tensor.dim() in (4, 5):
            fires = tensor.transpose(0, 1).reshape(tensor.shape[1], -1) != 0
            alive = fires.any(dim=1)
        else:
            return torch.zeros((), dtype=torch.float64, device=tensor.device)
        if alive.numel() == 0:
            return torch.zeros((), dtype=torch.float64, device=tensor.device)
        return 1.0 - alive.double().mean()
