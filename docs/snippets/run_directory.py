import json
import os

import pyarrow.parquet as pq
import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
with layerscope.watch(model, optimizer=optimizer, every=10, run="runs/layout") as scope:
    for _ in range(30):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss)

for folder, _, files in sorted(os.walk("runs/layout")):
    for name in sorted(files):
        print(os.path.join(folder, name))

with open("runs/layout/run.json") as file:
    meta = json.load(file)
print(sorted(meta))
print({key: meta[key] for key in ("status", "steps", "kernel", "recorded_rows", "dropped_rows")})

stats_file = next(f for f in os.listdir("runs/layout/stats") if f.endswith(".parquet"))
print(pq.read_schema(f"runs/layout/stats/{stats_file}").to_string(show_schema_metadata=False))
