import torch
from torch import nn

import layerscope

schedule = layerscope.Schedule(every=5, dense=2, sentinel=True)
print("recorded:", [step for step in range(12) if schedule.records(step)])

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with layerscope.watch(model, optimizer=optimizer, every=schedule) as scope:
    for step in range(8):
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()  # with optimizer=, its step ends the training step
        optimizer.zero_grad()
        if step == 5:  # an evaluation right after step 5 belongs to step 5
            model.eval()
            with torch.no_grad():
                model(torch.randn(64, 4))
            model.train()

frame = scope.frame()
rows = frame.groupby(["step", "phase", "sentinel"]).size().rename("rows")
print(rows.reset_index().to_string(index=False))
sentinel = frame.query("step == 3 and module == '2'")
columns = ["kind", "tensor", "numel", "min", "max", "absmax", "mean", "std"]
print(sentinel[columns].to_string(index=False))
