"""torchrun worker: one tiny model trained unwatched, then watched, on every rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker_train.py KIND DIR

KIND is ``ddp`` (DistributedDataParallel) or ``fsdp`` (FSDP2's ``fully_shard`` on each Linear
and the root). Both runs start from the same weights and data and run under the collective
log; the watched one records into ``DIR/run``, one directory for all ranks. Each rank writes
``DIR/plain{r}.json`` after the unwatched run and ``DIR/rank{r}.json`` after both; rank 0
then waits for all and writes ``DIR/loaded.json``, what ``layerscope.load`` reads of the run.
The tests check them.
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch import nn
from training_job import Expected, batches, mlp, save_loaded_run, start, train, write_json


def wrapped(kind: str) -> tuple[nn.Module, nn.Module]:
    """(the model to train, the module whose parameter names layerscope reports)."""
    model = mlp()
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model), model
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, model


def main(kind: str, directory: str) -> None:
    rank, _ = start()
    try:
        data = batches(rank)
        plain = train(wrapped(kind)[0], data, run=None)
        # Written first: the checks of the collective log need no watched run.
        write_json(f"{directory}/plain{rank}.json", {"rank": rank, "plain": plain})
        model, inner = wrapped(kind)
        expected = Expected(inner)
        watched = train(model, data, run=f"{directory}/run", expected=expected)
        result = {"rank": rank, "plain": plain, "watched": watched, "expected": expected.rows}
        write_json(f"{directory}/rank{rank}.json", result)
        dist.barrier()  # every rank has closed its scope
        if rank == 0:
            save_loaded_run(f"{directory}/run", f"{directory}/loaded.json")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
