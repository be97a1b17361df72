# run: torchrun --standalone --nproc_per_node=2
import torch
import torch.distributed as dist
from torch import nn

import layerscope

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)  # the same initial weights on every rank
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(10, 8, 16, generator=torch.Generator().manual_seed(rank))  # each its own
with layerscope.watch(model, optimizer=optimizer, run="runs/ddp", every=5) as scope:
    for batch in data:
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss)
dist.barrier()
if rank == 0:
    columns = ["step", "rank", "kind", "numel", "mean", "std", "zero_frac"]
    each = layerscope.load("runs/ddp")
    print(each.stats.query("module == '1'")[columns].to_string(index=False))
    merged = layerscope.load("runs/ddp", ranks="merge")
    print(merged.stats.query("module == '1'")[columns].to_string(index=False))
    print({entry["rank"]: entry["status"] for entry in each.meta["ranks"]})
dist.destroy_process_group()
