"""torchrun worker: a tiny transformer watched with attention=True under DDP, then FSDP2.

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker_attention.py DIR

Each rank trains on its own data and writes ``DIR/rank{r}.json``: for each kind, the failures,
the attention rows of the run (read back by rank 0 as ``DIR/{kind}/run``) and, from a float64
copy of the starting weights, the step 0 entropies of its own batch.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from training_job import start, write_json

sys.path.insert(0, str(Path(__file__).parents[1] / "attention"))
from test_capture import BATCH, DIM, LENGTH, Tiny, _expected

import layerscope

STEPS = 3


def wrapped(kind: str, model: nn.Module) -> nn.Module:
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def main(directory: str) -> None:
    rank, _ = start()
    try:
        generator = torch.Generator().manual_seed(100 + rank)
        data = [torch.randn(BATCH, LENGTH, DIM, generator=generator) for _ in range(STEPS)]
        result: dict[str, object] = {"rank": rank}
        for kind in ("ddp", "fsdp"):
            torch.manual_seed(0)
            plain = Tiny()
            expected = _expected(plain, data[:1])
            model = wrapped(kind, copy.deepcopy(plain))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            run = f"{directory}/{kind}/run"
            with layerscope.watch(model, optimizer, run=run, every=1, attention=True) as scope:
                for x in data:
                    model(x).pow(2).mean().backward()
                    optimizer.step()
                    optimizer.zero_grad()
            frame = scope.frame("attention")
            result[kind] = {
                "failures": scope.failures,
                "rows": frame.to_dict("list"),
                "expected": {name: values.tolist() for name, values in expected.items()},
            }
            dist.barrier()
            if rank == 0:
                stored = layerscope.load(run).attention
                write_json(f"{directory}/{kind}_loaded.json", stored.to_dict("list"))
        write_json(f"{directory}/rank{rank}.json", result)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
