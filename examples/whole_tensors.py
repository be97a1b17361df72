"""Keep whole tensors inside a watched run, render them in a worker, and animate them.

Run: python examples/whole_tensors.py --out /tmp/whole   (pip install 'layerscope[capture,plot]')

A small MLP learns a function of 8 inputs. Beside the statistics of every layer, the run keeps
the first layer's weight and the hidden layer's activations whole, every 5th step; a worker
process draws each kept tensor as a heat map PNG while training goes on. Afterwards the run's
tensors are read back and animated: the weight as a heat map, the activations as a PCA
scatter whose axes stay put from frame to frame.
"""

import argparse
from pathlib import Path

import torch
from torch import nn

import layerscope
from layerscope.tensors import HeatMap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("whole-tensors"))
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    inputs = torch.randn(256, 8)
    targets = torch.sin(inputs[:, :1] * 2) + inputs[:, 1:2] * inputs[:, 2:3]

    run = args.out / "run"
    tensors = {"include": r"^(0|3)$", "kinds": ("activation", "weight"), "every": 5}
    with layerscope.watch(
        model, optimizer, run=run, every=5, tensors=tensors, on_tensor=HeatMap(), workers=1
    ) as scope:
        for _ in range(args.steps):
            loss = (model(inputs) - targets).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    print(f"final loss {loss.item():.4f}; whole tensors not kept: {scope.tensors_dropped}")

    kept = layerscope.load(run).tensors
    print(f"the run kept {len(kept)} whole tensors:")
    print(kept.to_frame()[["step", "module", "kind", "tensor", "shape", "std"]].head(6))
    renders = sorted((run / "renders" / "heatmap").rglob("*.png"))
    print(
        f"the worker drew {len(renders)} heat maps, e.g. {renders[0].relative_to(run)}; "
        f"{scope.on_tensor_dropped} it had no time for were dropped: training never waits "
        f"for it"
    )

    weight = layerscope.animate(run, "0", "weight", what="heatmap", tensor="weight")
    hidden = layerscope.animate(run, "3", "activation", what="pca")
    for path in (weight, hidden):
        print(f"wrote {path.relative_to(args.out)}")


if __name__ == "__main__":
    main()
