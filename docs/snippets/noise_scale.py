import torch
from torch import nn

import layerscope

torch.manual_seed(0)
dim, sigma, micro_batch, k = 8, 0.5, 16, 4  # 4 micro-batches of 16 examples per step
w_star = torch.randn(dim, 1, dtype=torch.float64)
model = nn.Linear(dim, 1, bias=False).double()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
with layerscope.watch(model, optimizer=optimizer, every=10, noise_scale=True) as scope:
    for _ in range(40):
        for _micro in range(k):
            x = torch.randn(micro_batch, dim, dtype=torch.float64)
            y = x @ w_star + sigma * torch.randn(micro_batch, 1, dtype=torch.float64)
            loss = 0.5 * (model(x) - y).pow(2).mean() / k  # each micro-batch's loss / k
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

scalars = scope.frame("scalars")
noise = scalars[scalars.name.str.startswith("noise/")]
print(noise.pivot(index="step", columns="name", values="value").round(3).to_string())
