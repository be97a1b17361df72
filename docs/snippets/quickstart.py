import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

with layerscope.watch(model, optimizer=optimizer, every=10, run="runs/quickstart") as scope:
    for _ in range(50):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optimizer.step()  # ends the step: gradients are read before it, weights after
        optimizer.zero_grad()
        scope.step(loss=loss)  # the step's scalars; they stay on the device until a flush

run = layerscope.load("runs/quickstart")
print(run)
columns = ["module", "module_type", "kind", "tensor", "shape", "mean", "std", "absmax", "zero_frac"]
print(run.stats.query("step == 40")[columns].to_string(index=False, float_format="{:.4g}".format))
print(run.scalars.tail(3).to_string(index=False))
