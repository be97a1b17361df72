"""Watch a torch.compile'd model: recorded steps run eagerly, the others stay one graph.

Run: python examples/compiled.py

Prints dynamo's graph breaks and graphs compiled over the unrecorded steps, which watching
leaves at what the unwatched compiled model has (no graph break, no recompilation).
"""

import torch
import torch._dynamo.utils
from torch import nn

import layerscope


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)
    counters = torch._dynamo.utils.counters
    with layerscope.watch(compiled, optimizer=optimizer, every=5) as scope:
        for step in range(12):
            if step == 2:  # after the first compiled call: what the steady steps add
                counters.clear()
            loss = compiled(torch.randn(16, 32)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    frame = scope.frame()
    print("recorded steps:", sorted(set(frame["step"])))
    print("graph breaks after step 1:", sum(counters["graph_break"].values()))
    print("graphs compiled after step 1:", counters["stats"]["unique_graphs"])


if __name__ == "__main__":
    main()
