import torch
from torch import nn

import layerscope
from layerscope.sinks import Records, RunInfo, RunSummary


class Printer:
    """A sink: four methods, called on layerscope's writer thread."""

    def start(self, info: RunInfo) -> None:
        print(f"start: {len(info.modules)} modules")

    def write(self, records: Records) -> None:
        rows = 0 if records.stats is None else len(records.stats)
        steps = sorted({step for step, _, _ in records.scalars})
        calls = len(records.calls)  # a recorded step's order of module calls
        print(f"write {rows} rows of statistics, {calls} call events, scalars of steps {steps}")

    def flush(self) -> None:
        pass

    def close(self, summary: RunSummary) -> None:
        print(f"close: {summary.status}, {summary.steps} steps, {summary.recorded_rows} rows")


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with layerscope.watch(model, optimizer=optimizer, every=4, sinks=[Printer()]) as scope:
    for step in range(8):
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss)
        if step == 4:
            scope.flush()  # write what the steps so far recorded, now
