"""Watch a DDP job on two CPU processes: one run, and its statistics merged across the ranks.

Run: torchrun --standalone --nproc_per_node=2 examples/distributed.py [RUN_DIR]

Each rank trains on its own batches; `ranks="merge"` has rank 0 write whole-job rows (the
activations of both ranks' batches together). The same job with `ranks="each"` would write
each rank's rows, which `layerscope.load(path, ranks="merge")` merges the same way when read.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn

import layerscope


def main(path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(20, 8, 16, generator=torch.Generator().manual_seed(rank))
    with layerscope.watch(model, optimizer=optimizer, run=path, every=5, ranks="merge") as scope:
        for batch in data:
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    dist.barrier()
    if rank == 0:
        run = layerscope.load(path)
        activations = run.stats.query("kind == 'activation' and module == '1'")
        print(activations[["step", "rank", "numel", "mean", "std", "zero_frac"]].to_string())
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/distributed")
