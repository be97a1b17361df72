"""What a pytorch_inspector user wrote, with layerscope: videos of a layer's tensors, drawn in a
worker process while the model trains, frames dropped rather than training slowed.

Run: python examples/migrating/from_pytorch_inspector.py --out /tmp/inspector
(needs: pip install 'layerscope[plot,capture]'; MP4 also 'layerscope[video]')

pytorch_inspector's ``ParrallelHandler(callback_onrun=DataRecorder(...).tensor_plot2D,
frequency=N)`` and ``track_model`` / ``track_layer`` wrote an MP4 per layer from a child
process. Here ``watch(tensors=..., on_tensor=Video(...))`` does: the hook copies the tensor,
a worker draws it and appends the frame; the file is whole when the scope closes. The
gradients of the weights are filmed too, read where the optimizer sees them.
"""

import argparse
from pathlib import Path

import torch
from torch import nn

import layerscope
from layerscope.tensors import HeatMap, Video


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("inspector-example"))
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 8)
    y = x[:, :2].sum(dim=1, keepdim=True)
    with layerscope.watch(
        model,
        optimizer,
        run=args.out / "run",
        every=1,
        # pytorch_inspector's frequency=N: every N-th step ("every_seconds" rates it in time)
        tensors={
            "include": r"^0$",
            "kinds": ["activation", "weight_grad"],
            "every": 3,
            "keep": False,
        },
        on_tensor=Video(HeatMap(), format="gif", fps=4),
        workers=1,
    ) as scope:
        for _ in range(args.steps):
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
        scope.close(timeout=60)  # the worker finishes its videos before the run ends

    from PIL import Image

    for path in sorted((args.out / "run").rglob("*.gif")):
        with Image.open(path) as gif:
            print(f"{path.relative_to(args.out)}: {gif.n_frames} frames")
    print("frames dropped:", scope.on_tensor_dropped)


if __name__ == "__main__":
    main()
