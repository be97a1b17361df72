import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

with layerscope.watch(model, every=1) as scope:  # no run=: the records stay in memory
    for _ in range(3):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss)  # without optimizer=, this call ends each step

frame = scope.frame()  # a pandas DataFrame
print(frame.groupby("step").size().to_dict())
print(frame.query("step == 2 and kind == 'activation'")[["module", "shape", "mean", "zero_frac"]])
print(scope.frame("scalars"))
