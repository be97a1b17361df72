"""torchrun worker: DDP on every rank, each keeping whole tensors of one layer in one run.

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker_tensors.py DIR

Each rank trains the same model on its own batches with ``tensors=`` keeping the first
Linear's output and weight every other step, and an independent forward hook noting what that
output was. It writes ``DIR/tensors{r}.json``: its steps, and whether each kept activation
equals the hook's. The test reads the run's files of each rank.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import Tensor, nn
from training_job import batches, mlp, start, write_json

import layerscope


def main(directory: str) -> None:
    rank, _ = start()
    try:
        inner = mlp()
        model = nn.parallel.DistributedDataParallel(inner)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        seen: list[Tensor] = []
        inner[0].register_forward_hook(lambda m, args, out: seen.append(out.detach().clone()))
        tensors = {"include": "^0$", "kinds": ("activation", "weight"), "every": 2}
        with layerscope.watch(model, optimizer, run=f"{directory}/run", tensors=tensors) as scope:
            for x in batches(rank)[:4]:
                model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        kept = [r for r in scope.tensors if r.kind == "activation"]
        write_json(
            f"{directory}/tensors{rank}.json",
            {
                "rank": rank,
                "steps": [r.step for r in kept],
                "equal": [torch.equal(r.value, seen[r.step]) for r in kept],
            },
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
