"""torchrun worker: what ``local_tensor`` and ``shard_label`` give for DTensors on 2 ranks.

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker_shards.py DIR

DTensors of several placements on a 1-D mesh of 2 ranks and on 2-D meshes of shapes (2, 1)
and (1, 2), and an FSDP2 parameter with its gradient. Both helpers run under the collective
log, which must stay empty; a DTensor reduction under another log shows that the log would
have seen one. Each rank writes ``DIR/rank{r}.json``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from collective_log import CollectiveLog
from torch import nn
from training_job import start, write_json

from layerscope.distributed._shards import local_tensor, shard_label


def dtensors() -> dict[str, torch.Tensor]:
    """DTensors by a name that says their mesh shape and placements."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, init_device_mesh
    from torch.distributed.tensor.placement_types import _StridedShard

    line = init_device_mesh("cpu", (2,))
    column = init_device_mesh("cpu", (2, 1), mesh_dim_names=("outer", "inner"))
    row = init_device_mesh("cpu", (1, 2), mesh_dim_names=("outer", "inner"))
    cases = {
        "(2) shard": (line, [Shard(0)]),
        "(2) strided shard": (line, [_StridedShard(0, split_factor=2)]),
        "(2) replicate": (line, [Replicate()]),
        "(2) partial": (line, [Partial()]),
        "(2,1) shard shard": (column, [Shard(0), Shard(1)]),
        "(2,1) replicate shard": (column, [Replicate(), Shard(0)]),
        "(1,2) shard shard": (row, [Shard(0), Shard(1)]),
        "(1,2) shard replicate": (row, [Shard(0), Replicate()]),
        "(1,2) replicate replicate": (row, [Replicate(), Replicate()]),
    }
    made = {
        name: DTensor.from_local(torch.randn(2, 3), mesh, placements, run_check=False)
        for name, (mesh, placements) in cases.items()
    }
    # An activation of tensor parallelism: a DTensor with a graph behind it.
    leaf = DTensor.from_local(torch.randn(2, 3, requires_grad=True), line, [Shard(0)])
    made["(2) shard, with grad_fn"] = leaf * 2
    return made


def fsdp_tensors() -> dict[str, torch.Tensor]:
    """An FSDP2 parameter of uneven rows (2 on rank 0, 1 on rank 1) and its gradient."""
    from torch.distributed.fsdp import fully_shard

    layer = nn.Linear(4, 3)
    fully_shard(layer)
    layer(torch.randn(5, 4)).sum().backward()
    return {"fsdp weight": layer.weight, "fsdp weight.grad": layer.weight.grad}


def main(directory: str) -> None:
    rank, _ = start()
    try:
        tensors = dtensors() | fsdp_tensors()
        with CollectiveLog() as log:
            labels = {name: shard_label(t) for name, t in tensors.items()}
            locals_ = {name: local_tensor(t) for name, t in tensors.items()}
        result = {
            "rank": rank,
            "labels": labels,
            "collectives": log.calls,
            "same_storage": {
                name: locals_[name].data_ptr() == t.to_local().data_ptr()
                for name, t in tensors.items()
            },
            "shapes": {name: list(t.shape) for name, t in locals_.items()},
            "plain": {name: type(t).__name__ == "Tensor" for name, t in locals_.items()},
            "grad_fn": {name: t.grad_fn is not None for name, t in locals_.items()},
        }
        with CollectiveLog() as control:  # the log sees a DTensor's own collectives
            tensors["(2) shard"].sum().full_tensor()
        result["control"] = control.calls
        write_json(f"{directory}/rank{rank}.json", result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
