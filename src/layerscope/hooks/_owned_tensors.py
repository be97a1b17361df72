"""The watched parameters and buffers as the reads see them: each tensor with its owners.

Tied weights are one tensor owned by several modules: read once, recorded under each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from layerscope.recording import GroupEntry, Owner, Target


def entry_of(owners: Sequence[Owner], tensor: Tensor, shard: str | None = None) -> GroupEntry:
    """A reading of ``tensor`` under its first owner, and under the others too (tied)."""
    first = owners[0]
    return GroupEntry(Target(first.module, first.module_type), first.tensor, tensor, owners[1:],
                      shard)  # fmt: skip


def owned_tensors(
    targets: Sequence[tuple[str, nn.Module]],
    named: Callable[[nn.Module], Iterator[tuple[str, Tensor]]],
) -> list[tuple[Tensor, list[Owner]]]:
    """Unique tensors of the targets with every target that owns each (tied weights)."""
    owners: dict[int, tuple[Tensor, list[Owner]]] = {}
    for name, module in targets:
        for tensor_name, tensor in named(module):
            entry = owners.setdefault(id(tensor), (tensor, []))
            entry[1].append(Owner(name, type(module).__name__, tensor_name))
    return list(owners.values())


def backward_probe(root: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> Tensor | None:
    """A parameter whose gradient tells that a backward pass ran: one hook, one call a pass.

    The first trainable parameter of the model that the first optimizer steps (or of the
    model, without an optimizer); None if there is none.
    """
    trainable = [param for param in root.parameters() if param.requires_grad]
    if optimizers:
        stepped = {id(param) for group in optimizers[0].param_groups for param in group["params"]}
        trainable = [param for param in trainable if id(param) in stepped] or trainable
    return trainable[0] if trainable else None


def fp16_autocast(param: Tensor) -> bool:
    """Whether fp16 autocast is on for ``param``'s device: the mixed precision of GradScaler."""
    device = param.device.type
    try:
        return bool(torch.is_autocast_enabled(device)) and (
            torch.get_autocast_dtype(device) == torch.float16
        )
    except (AttributeError, RuntimeError, TypeError):  # an older torch, an unknown device type
        return False
