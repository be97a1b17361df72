import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(inplace=True), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)

with layerscope.capture(model, stash_value=lambda t: t.std().item()) as cap:
    (model(x) - y).pow(2).mean().backward()
print(cap.to_frame()[["module", "kind", "tensor", "dtype", "std"]])


def stash(event):  # a module-level function, or any callable
    return {"input_norm": event.args[0].norm().item(), "out": event.value[:2]}


with layerscope.capture(model, include=r"^2$", kinds=("activation",), stash=stash) as cap:
    model(x)
print(cap.records[0])
cap.save("captures/stashed")
print(layerscope.load_capture("captures/stashed").records[0].value["input_norm"])
