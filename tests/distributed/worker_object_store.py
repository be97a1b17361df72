"""torchrun worker: DDP on every rank, one run written to an S3 server, read back by rank 0.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \
        worker_object_store.py URL OPTIONS DIR

URL is the run's ``s3://`` URL and OPTIONS the storage options as JSON (the server's endpoint,
dummy credentials). Each rank writes ``DIR/rank{r}.json`` (its scope's failures); once both
closed their scopes, rank 0 writes ``DIR/loaded.json``, what ``layerscope.load`` reads of the
run.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from training_job import KINDS, batches, mlp, start, write_json

import layerscope
from layerscope.store import ParquetStore


def main(url: str, options_json: str, directory: str) -> None:
    rank, _ = start()
    try:
        options = json.loads(options_json)
        model = nn.parallel.DistributedDataParallel(mlp())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        store = ParquetStore(url, flush_steps=1, storage_options=options)
        with layerscope.watch(model, optimizer=optimizer, every=1, run=store, kinds=KINDS) as scope:
            for x in batches(rank):
                model(x).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        write_json(f"{directory}/rank{rank}.json", {"rank": rank, "failures": scope.failures})
        dist.barrier()  # every rank has closed its scope
        if rank == 0:
            run = layerscope.load(url, storage_options=options)
            stats = run.stats
            loaded = {
                "ranks": run.meta["ranks"],
                "skipped": run.skipped,
                "rows": {str(r): int((stats["rank"] == r).sum()) for r in (0, 1)},
                "keys": {
                    str(r): sorted(
                        map(list, stats[stats["rank"] == r][["step", "module", "kind"]].values)
                    )
                    for r in (0, 1)
                },
            }
            write_json(f"{directory}/loaded.json", loaded)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
