"""Send a small model's layer statistics to TensorBoard, W&B and MLflow at once, offline.

Run: python examples/sinks.py --out /tmp/sinks   (needs: pip install 'layerscope[tensorboard,
wandb,mlflow,dataframe]')

W&B runs offline (``wandb sync`` uploads the run later) and MLflow writes a local file store,
so nothing here needs a network or an account. The same sinks work online: leave out the
environment variables below and pass ``tracking_uri=`` for your MLflow server.
"""

import argparse
import os
from pathlib import Path

import torch
from torch import nn

import layerscope
from layerscope.sinks import MLflow, TensorBoard, WandB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("sinks-example"))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_DIR", str(out))
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it by name

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    inputs = torch.randn(256, 16)
    targets = inputs[:, :4].sum(dim=1, keepdim=True)

    sinks = [
        TensorBoard(out / "tensorboard"),
        WandB(project="layerscope-example"),
        MLflow(tracking_uri=(out / "mlruns").as_uri(), experiment="layerscope-example"),
    ]
    with layerscope.watch(
        model, optimizer=optimizer, run=out / "run", every=5, sinks=sinks
    ) as scope:
        for _ in range(args.steps):
            batch = torch.randint(0, len(inputs), (32,))
            loss = nn.functional.mse_loss(model(inputs[batch]), targets[batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss, lr=optimizer.param_groups[0]["lr"])

    tensorboard, wandb_sink, mlflow_sink = sinks
    run = layerscope.load(out / "run")
    print(f"run {out / 'run'}: {run.meta['status']}, {len(run.stats)} rows of statistics")
    print(f"TensorBoard: tensorboard --logdir {tensorboard.logdir}")
    print(f"W&B: offline run {wandb_sink.run_id} under {out / 'wandb'} (wandb sync to upload)")
    print(f"MLflow: run {mlflow_sink.run_id} in {out / 'mlruns'}")


if __name__ == "__main__":
    main()
