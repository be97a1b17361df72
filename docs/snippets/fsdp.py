# run: torchrun --standalone --nproc_per_node=2
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import layerscope

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
for layer in (model[0], model[2]):
    fully_shard(layer)  # FSDP2: each rank holds half of each parameter's rows
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(10, 8, 16, generator=torch.Generator().manual_seed(rank))
with layerscope.watch(model, optimizer=optimizer, run="runs/fsdp", every=5) as scope:
    for batch in data:
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss)
dist.barrier()
if rank == 0:
    columns = ["step", "rank", "kind", "tensor", "shard", "shape", "numel", "mean", "l2"]
    query = "module == '0' and kind in ('weight', 'weight_grad') and step == 5"
    print(layerscope.load("runs/fsdp").stats.query(query)[columns].to_string(index=False))
    merged = layerscope.load("runs/fsdp", ranks="merge").stats.query(query)
    print(merged[columns].to_string(index=False))
dist.destroy_process_group()
