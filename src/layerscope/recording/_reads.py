"""How the recorder reads a tensor: this process's part, dense layouts only, its version.

The version counter tells whether a tensor changed in place since it was last read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from layerscope.distributed import local_tensor, shard_label


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
    """Sparse and other non-dense layouts have no memory of values to read as it is."""
    if tensor.layout is not torch.strided:
        raise TypeError(f"a {tensor.layout} tensor is not read: only dense ones are")
