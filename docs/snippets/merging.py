import torch
from torch import nn

import layerscope


class Twice(nn.Module):
    """Calls one Linear twice in a forward pass: its rows get call 0 and call 1."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(torch.relu(self.shared(x)))


torch.manual_seed(0)
model = Twice()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
rms = {"rms": lambda t: t.float().pow(2).mean().sqrt()}  # a custom statistic
micro_batches = [torch.randn(4, 8), torch.randn(12, 8)]  # gradient accumulation: 2 passes
with layerscope.watch(
    model, optimizer=optimizer, every=1, kinds=["activation"], stats=["mean", "std", "hist", rms]
) as scope:
    outputs = []
    for batch in micro_batches:
        out = model(batch)
        outputs.append(out.detach())
        out.pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()

frame = scope.frame()
columns = ["step", "module", "tensor", "call", "shape", "numel", "mean", "std", "rms"]
print(frame[columns].to_string(index=False))
# call 1 is the model's output: its row is the two micro-batches' statistics, merged exactly
both = torch.cat(outputs).double()
print(f"torch: mean {both.mean().item():.6f}, std {both.std().item():.6f}")

hist = frame["hist"].iloc[1]  # 256 exact counts, one per float32 exponent
edges = layerscope.stats.log2_bin_edges()
for slot in hist.nonzero()[0]:
    print(f"{edges[slot]:.4g} <= |x| < {edges[slot + 1]:.4g}: {hist[slot]}")
