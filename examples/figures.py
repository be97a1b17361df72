"""Train a deep MLP on scikit-learn's digits and draw every figure of its run.

Run: python examples/figures.py [OUT]   (needs: pip install 'layerscope[demo,plot]')

The learning rate is high on purpose: a few ReLU units die and the gradients of the first
layers shrink, which the figures show. They are written to OUT (default: docs/images), with
the run itself in runs/figures.
"""

import shutil
import sys
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

import layerscope

STEPS = 300


def make_model(width: int = 64, depth: int = 6) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    features = 64
    for _ in range(depth):
        layers += [nn.Linear(features, width), nn.ReLU()]
        features = width
    return nn.Sequential(*layers, nn.Linear(features, 10))


def train(path: Path) -> layerscope.Run:
    torch.manual_seed(0)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    kinds = ("activation", "grad", "weight", "weight_grad", "update")
    shutil.rmtree(path, ignore_errors=True)  # a run from an earlier call
    with layerscope.watch(model, run=path, every=1, optimizer=optimizer, kinds=kinds) as scope:
        for _ in range(STEPS):
            batch = torch.randint(0, len(images), (64,))
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return layerscope.load(path)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    out.mkdir(parents=True, exist_ok=True)
    run = train(Path("runs/figures"))
    relus = r"^(2|4|6|8|10|12)$"  # the ReLUs' outputs
    figures = {
        "stats": run.plot.stats(kind="activation", stats=("mean", "std"), modules=relus),
        "color_dim": run.plot.color_dim(kind="activation", modules=["2", "6", "12"]),
        "dead_chart": run.plot.dead_chart(modules=relus),
        "heatmap": run.plot.heatmap(stat="absmax", kind="grad"),
        "precision": run.plot.precision("e4m3", kind="grad"),
        "grad_norms": run.plot.grad_norms(),
        "update_ratio": run.plot.update_ratio(),
        "histogram": run.plot.histogram("1", kind="grad", steps=[0, 10, 100, 299]),
        "scalars": run.plot.scalars(),
    }
    for name, fig in figures.items():
        fig.savefig(out / f"{name}.png", dpi=72)
        print(out / f"{name}.png")
    animation = layerscope.animate(
        run, "1", "grad", path=out / "grad_histogram.gif", steps=range(0, STEPS, 5), fps=10
    )
    print(animation)


if __name__ == "__main__":
    main()
