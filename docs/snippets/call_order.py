import torch
from torch import nn

import layerscope


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 1)
        self.use_b = False

    def forward(self, x):
        return self.head(self.b(x) if self.use_b else self.a(x))


model = Branching()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with layerscope.watch(model, optimizer=optimizer, every=1, run="runs/branching") as scope:
    for step in range(4):
        model.use_b = step == 2
        model(torch.ones(2, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

calls = scope.frame("calls")
print(calls[calls.step >= 1].to_string(index=False))

# As stored: a step that repeats the order of the step before is one row, event "same".
run = layerscope.load("runs/branching")
print(run.sql("select step from calls_stored where event = 'same'"))
