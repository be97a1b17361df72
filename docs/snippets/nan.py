import torch
from torch import nn

import layerscope


def train(run: str, alerts: object = True) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # far too high: it diverges
    schedule = layerscope.Schedule(every=10, sentinel=True)  # the sentinel: every step, cheaply
    with layerscope.watch(
        model, optimizer=optimizer, every=schedule, run=run, alerts=alerts
    ) as scope:
        for _ in range(30):
            inputs = torch.randn(32, 8)
            loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)


train("runs/diverges")
run = layerscope.load("runs/diverges")
print(run.alerts[["step", "rule", "module", "kind", "tensor", "severity"]])
print(run.alerts["message"].iloc[0])

# The sentinel's rows of that step, in forward order, then backward order:
rows = run.stats.query("step == 7")
print(rows[["module", "kind", "tensor", "sentinel", "min", "max", "absmax"]].to_string(index=False))

try:  # alerts="raise": stop training at the first non-finite value
    train("runs/raises", alerts="raise")
except layerscope.NonFiniteError as error:
    print(f"NonFiniteError: {error}")
