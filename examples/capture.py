"""Keep whole activations of one layer while a small model trains, then save and reload them.

Run: python examples/capture.py --out /tmp/capture   (needs: pip install 'layerscope[capture]')

Every 10th step keeps the hidden layer's whole output and its gradient; a second capture keeps
only a running mean of each unit's activation over every step, in constant memory.
"""

import argparse
from pathlib import Path

import torch
from torch import nn

import layerscope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("capture-example"))
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(inplace=True), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(64, 8)
    targets = inputs[:, :2].sum(dim=1, keepdim=True)

    whole = layerscope.capture(model, include=r"^0$", every=10)
    unit_means = layerscope.capture(
        model,
        include=r"^1$",
        kinds="activation",
        stash_value=lambda t: t.mean(dim=0),  # (32,) per step: one value per unit
        reduction="mean",
    )
    with whole, unit_means:
        for _ in range(args.steps):
            loss = (model(inputs) - targets).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            whole.step()
            unit_means.step()

    for record in whole.records[:4]:
        print(
            f"step {record.step:2d} {record.kind:10s} {record.module}.{record.tensor} "
            f"{tuple(record.value.shape)} std={record.value.std():.4f}"
        )
    print(f"kept {len(whole.records)} tensors, {whole.bytes} bytes")
    (mean,) = unit_means.records
    dead = int((mean.value == 0).sum())
    print(f"mean ReLU output over {mean.count} steps: {dead} of {mean.value.numel()} units dead")

    saved = whole.save(args.out, overwrite=True)
    loaded = layerscope.load_capture(saved)
    same = all(
        torch.equal(a.value, b.value) and a.metadata() == b.metadata()
        for a, b in zip(loaded.records, whole.records, strict=True)
    )
    print(f"saved to {saved.name}/ and loaded back: {len(loaded.records)} records, same={same}")


if __name__ == "__main__":
    main()
