import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(inplace=True), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)

with layerscope.capture(model, include=r"^0$", kinds=("weight_grad",), optimizer=optimizer) as cap:
    for step in range(2):
        (model(x) - y).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)
        expected = model[0].weight.grad.clone()
        optimizer.step(); optimizer.zero_grad()
        cap.step()
print(cap.to_frame(torch.linalg.norm, "norm")[["step", "module", "kind", "tensor", "shape", "norm"]])
print(torch.equal(cap.records[-2].value, expected))  # the clipped gradient of step 1
