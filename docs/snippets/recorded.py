import torch
from torch import nn

import layerscope


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.linear(x)
        return {"hidden": hidden, "normed": self.norm(hidden)}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)["normed"])


torch.manual_seed(0)
model = Model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
every_kind = ("activation", "grad", "weight", "weight_grad", "update", "input", "buffer")
# "^encoder" matches the whole name "encoder": the block is watched too, with its children
with layerscope.watch(
    model, optimizer=optimizer, every=1, kinds=every_kind, include="^encoder"
) as scope:
    loss = model(torch.randn(32, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

frame = scope.frame()
print(frame[["module", "module_type", "kind", "tensor", "shape"]].to_string(index=False))
