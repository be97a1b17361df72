"""Distributed tensors read as this process's shard, with no collective.

FSDP2 and tensor parallelism hold parameters, their gradients and some activations as
DTensors. Every op on a DTensor may talk to the other ranks, and a rank whose shard is empty
takes other branches than one whose shard is not: a reduction read from a DTensor hangs or
aborts training. So layerscope reads ``to_local()``, the local shard, and labels its rows with
which shard that is.

Nothing here imports ``torch.distributed.tensor``: a DTensor exists only once it is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor, Placement


def local_tensor(tensor: Tensor) -> Tensor:
    """This process's shard of a DTensor, or any other tensor as it is; never a collective.

    Args:
        tensor: a tensor of any kind: a plain tensor, a parameter (FSDP2's are DTensors), a
            DTensor's ``.grad`` (a DTensor too), an activation.

    Returns:
        For a DTensor, its local tensor as the DTensor holds it: not a copy, with no autograd
        node made for it, and possibly empty (an uneven shard). Whatever the placements,
        nothing is gathered or reduced. Any other tensor is returned unchanged.

    Examples:
        >>> x = torch.ones(3)
        >>> local_tensor(x) is x
        True
    """
    dtensor = _as_dtensor(tensor)
    if dtensor is None:
        return tensor
    with torch.no_grad():  # to_local() then hands back the local tensor, with no graph node
        return dtensor.to_local()


def shard_label(tensor: Tensor) -> str | None:
    """Which shard of a sharded DTensor this process holds, as ``"i/n"``; never a collective.

    ``n`` is the number of distinct shards: the product of the mesh's sizes along the dims
    where the tensor is sharded (``Shard``, or ``_StridedShard`` as FSDP2 over tensor
    parallelism makes). ``i`` is this rank's mesh coordinate over those dims, flattened in
    row-major order. Mesh dims that replicate (or hold partial sums) do not count: ranks
    that differ only there hold the same shard. A tensor sharded over a mesh dim of size 1
    is ``"0/1"``.

    Args:
        tensor: a tensor of any kind.

    Returns:
        ``"i/n"``; None for a tensor that is not a DTensor, for a DTensor sharded along no
        mesh dim (each rank holds a replica), and on a rank outside the tensor's mesh.

    Examples:
        >>> shard_label(torch.ones(3)) is None
        True
    """
    dtensor = _as_dtensor(tensor)
    if dtensor is None:
        return None
    mesh = dtensor.device_mesh
    coordinate = mesh.get_coordinate()  # from the mesh's rank layout, no communication
    if coordinate is None:
        return None
    return _label(dtensor.placements, coordinate, tuple(mesh.shape))


def _label(
    placements: Sequence[Placement], coordinate: Sequence[int], mesh_shape: Sequence[int]
) -> str | None:
    """``"i/n"`` of the shard at ``coordinate`` of a mesh of ``mesh_shape``; None if unsharded."""
    index, count, sharded = 0, 1, False
    for placement, position, size in zip(placements, coordinate, mesh_shape, strict=True):
        if _is_sharded(placement):
            index, count, sharded = index * size + position, count * size, True
    return f"{index}/{count}" if sharded else None


def _is_sharded(placement: Placement) -> bool:
    # _StridedShard is no Shard, and its is_shard() is False (torch 2.13).
    placement_types = sys.modules["torch.distributed.tensor.placement_types"]
    strided = getattr(placement_types, "_StridedShard", ())
    return placement.is_shard() or isinstance(placement, strided)


def _as_dtensor(tensor: Tensor) -> DTensor | None:
    """``tensor`` if it is a DTensor; cheap, and imports nothing."""
    if type(tensor) is Tensor:  # the common case, decided without a lookup
        return None
    module = sys.modules.get("torch.distributed.tensor")
    dtensor_type: type[DTensor] | None = getattr(module, "DTensor", None)
    if dtensor_type is not None and isinstance(tensor, dtensor_type):
        return tensor
    return None
