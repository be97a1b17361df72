"""How the recorder reads a tensor: this process's part, dense layouts only, its version.

Tensors read together are grouped by device and dtype where the GPU kernels take a group.

The version counter tells whether a tensor changed in place since it was last read, and so
whether a reading may share the row of the one before (``Seen``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from layerscope.distributed import local_tensor, shard_label
from layerscope.model import Kind
from layerscope.recording._readings import CustomRef
from layerscope.recording._subjects import GroupEntry
from layerscope.stats import CustomStat, group_reads


class Seen(NamedTuple):  # a NamedTuple: a frozen dataclass takes 0.7 us to make
    """A tensor recorded since the last flush: which row holds its partials."""

    tensor: weakref.ref[Tensor]  # a dead tensor's id may be reused: check it is the same
    version: int  # in-place changes since bump it
    buffer_id: int
    row: int
    custom: tuple[CustomRef, ...]
    stats: Mapping[str, CustomStat]  # the custom statistics ``custom`` holds


def version_of(tensor: Tensor) -> int | None:
    """The tensor's version counter; None for inference tensors, which keep none."""
    return None if tensor.is_inference() else tensor._version


def local_part(tensor: Tensor, shard: str | None) -> tuple[Tensor, str | None]:
    """This process's part of ``tensor``, and the label of its shard.

    Reading a DTensor whole would be a collective on the training thread, where the ranks'
    collectives must stay in step with the unwatched run's.
    """
    label = shard_label(tensor)
    return local_tensor(tensor), shard if label is None else label


def check_strided(tensor: Tensor) -> None:
    """Sparse and other non-dense layouts have no memory of values to read as it is.

    Nor has a tensor on the meta device: its partials could never be copied to the host, and
    the flush that tried would lose the rows of every other tensor with them.
    """
    if tensor.layout is not torch.strided:
        raise TypeError(f"a {tensor.layout} tensor is not read: only dense ones are")
    if tensor.device.type == "meta":
        raise TypeError("a tensor on the meta device is not read: it holds no values")


def grouped(
    entries: Sequence[GroupEntry],
    kind: Kind,
    verb: str,
    alone: Callable[[GroupEntry], None],
    fail: Callable[[str, BaseException], None],
) -> dict[tuple[torch.device, torch.dtype], list[GroupEntry]]:
    """``entries`` that the GPU kernels read, as local tensors by device and dtype.

    ``alone`` reads each of the others as it is. A tensor that cannot be read costs only its
    own reading (``fail`` names it, after ``verb``).
    """
    groups: dict[tuple[torch.device, torch.dtype], list[GroupEntry]] = {}
    for entry in entries:
        try:
            tensor, shard = entry.tensor, entry.shard
            if type(tensor) is not Tensor:
                tensor, shard = local_part(tensor, shard)
            if tensor.is_nested or not group_reads(tensor):
                alone(entry)
                continue
            check_strided(tensor)
            local = GroupEntry(entry.target, entry.name, tensor, entry.also_owned_by, shard)
            groups.setdefault((tensor.device, tensor.dtype), []).append(local)
        except Exception as error:
            fail(f"{verb} {kind.value} {entry.name!r} of {entry.target.name!r}", error)
    return groups
