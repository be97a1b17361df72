"""torchrun worker: weight gradients kept under DDP are the all-reduced ones, on every rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_weight_grads_script.py DIR

Each rank trains the same model on its own batches under ``capture(kinds="weight_grad")``
(no optimizer: read when backward ends) and under ``watch(tensors=...)`` with one, clones
``param.grad`` by hand after each backward, and a copy without DDP gives the rank's local
gradient. It writes ``DIR/rank{r}.json``.
"""

from __future__ import annotations

import copy
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import layerscope


def main(directory: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)
        inner = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
        plain = copy.deepcopy(inner)  # the same weights, no all-reduce: the local gradient
        model = nn.parallel.DistributedDataParallel(inner)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(100 + rank)
        batches = [torch.randn(8, 4, generator=generator) for _ in range(4)]
        by_hand, local = [], []
        cap = layerscope.capture(model, include="^0$", kinds="weight_grad")
        tensors = {"include": "^0$", "kinds": ["weight_grad"], "every": 1}
        scope = layerscope.watch(model, optimizer, tensors=tensors)
        for x in batches:
            model(x).pow(2).mean().backward()
            plain(x).pow(2).mean().backward()
            by_hand.append(inner[0].weight.grad.clone())
            local.append(plain[0].weight.grad.clone())
            optimizer.step()
            plain_optimizer.step()
            optimizer.zero_grad()
            plain_optimizer.zero_grad()
            cap.step()
        cap.close()
        scope.close()
        captured = [r.value for r in cap.records if r.tensor == "weight"]
        watched = [r.value for r in scope.tensors.records if r.tensor == "weight"]
        result = {
            "captured": [t.tolist() for t in captured],
            "equal_by_hand": [torch.equal(a, b) for a, b in zip(captured, by_hand, strict=True)],
            "watched_equal": [torch.equal(a, b) for a, b in zip(watched, by_hand, strict=True)],
            "equal_local": [torch.equal(a, b) for a, b in zip(captured, local, strict=True)],
        }
        with open(f"{directory}/rank{rank}.json", "w") as file:
            json.dump(result, file)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
