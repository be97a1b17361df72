"""What a torchember user wrote, with layerscope: per-module statistics of inputs, outputs and
weights with a statistic of their own per kind, the module tree, and every step's call order.

Run: python examples/migrating/from_torchember.py   (needs: pip install 'layerscope[dataframe]')

torchember's ``torchEmber(model)`` logged ``in``/``out``/``weight``/``grad`` statistics per
module, ``mt_log`` kept the last forward's enter/exit order in memory, and ``set_metric``
swapped the statistic of one kind. Here the statistics come from the tensor's own device, the
call order is kept for every recorded step, and each kind may have statistics of its own.
"""

import torch
from torch import nn

import layerscope


class Net(nn.Module):
    """A model whose branch changes with the step: torchember's mt_log showed the last only."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.left = nn.Linear(8, 2)
        self.right = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, use_right: bool = False) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        return self.right(h) if use_right else self.left(h)


def rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean().sqrt()


def main() -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    with layerscope.watch(
        model,
        optimizer,
        every=1,
        kinds=("input", "activation", "weight"),
        stats=["mean", "std", "min", "max", {"activation": {"rms": rms}}],
    ) as scope:
        for step in range(4):
            loss = (model(x, use_right=step % 2 == 1) - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)

    stats = scope.frame()
    inputs = stats[(stats.kind == "input") & (stats.module == "encoder")]
    print("encoder's input rows:", sorted(set(inputs.tensor)))
    out = stats[(stats.kind == "activation") & (stats.module == "encoder") & (stats.step == 0)]
    print(f"encoder's output rms at step 0: {out.rms.item():.6f}")
    weights = stats[stats.kind == "weight"]
    print("rms of weight rows:", "all null" if weights.rms.isna().all() else "set")
    print("modules:", [info.name for info in scope.modules])
    calls = scope.frame("calls")
    for step in (2, 3):
        entered = calls[(calls.step == step) & (calls.event == "enter")].module.tolist()
        print(f"step {step} entered:", entered)


if __name__ == "__main__":
    main()
