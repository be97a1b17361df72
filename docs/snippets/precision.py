import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
with torch.no_grad():
    model[0].weight.mul_(1000.0)  # a layer whose outputs reach past fp8 e4m3's 448
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(10, (32,)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

columns = ["module", "kind", "tensor", "numel", "overflow", "underflow", "lost_frac", "scale_exp"]
for fmt in ("e4m3", "e5m2"):
    frame = layerscope.precision(scope, fmt)
    print(f"{fmt}, step 1:")
    print(frame[frame.step == 1][columns].to_string(index=False))
