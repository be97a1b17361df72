"""Watch a LightningModule train, with layerscope's Lightning callback.

Run: python examples/lightning_callback.py [--out DIR] [--steps N]
(needs: pip install 'layerscope[lightning,dataframe]')

The run goes into the logger's directory, next to Lightning's own metrics.csv.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import lightning as L
import pandas as pd
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import layerscope
from layerscope.integrations.lightning import LayerscopeCallback


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("val_loss", loss)  # Lightning's own metrics.csv, next to the run
        return loss

    def configure_optimizers(self) -> dict[str, object]:
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.97)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def loader(samples: int, seed: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=generator)
    y = x[:, :1].sin() + 0.1 * torch.randn(samples, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/lightning", help="the logger's save_dir")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no banner
    warnings.filterwarnings("ignore", module="lightning")  # tips on a tiny dataset

    torch.manual_seed(0)
    # Lightning validates after global step 10, 20...: layerscope's steps 9, 19... (it counts
    # from 0). Recording those steps puts training and validation rows under the same steps.
    every = layerscope.Schedule(every=10, start=9)
    callback = LayerscopeCallback(every=every, kinds=("activation", "grad", "weight", "update"))
    trainer = L.Trainer(
        max_steps=args.steps,
        accumulate_grad_batches=2,  # two micro-batches per step: merged into one
        val_check_interval=20,  # batches: validation after every 10 steps
        limit_val_batches=2,
        logger=CSVLogger(args.out),
        callbacks=[callback],
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Regression(), loader(2 * 16 * args.steps, seed=1), loader(64, seed=2))

    run = layerscope.load(callback.run_dir)
    stats = run.stats
    evaluation = stats[stats.phase == "eval"]
    print(f"run {callback.run_dir}: {run.meta['status']}, {trainer.global_step} steps")
    print(f"recorded steps {sorted(set(stats.step))}, evaluation at {sorted(set(evaluation.step))}")

    scalars = run.scalars.pivot_table(index="step", columns="name", values="value")
    print("\nloss and lr at those steps (recorded at every step):")
    print(scalars.iloc[9::10].to_string(float_format="{:.4g}".format))

    last = stats[stats.step == stats.step.max()]
    activation = last[last.kind == "activation"].pivot_table(
        index="module", columns="phase", values="std", aggfunc="first"
    )
    weights = last[(last.kind == "weight") & (last.tensor == "weight")].set_index("module")
    updates = last[(last.kind == "update") & (last.tensor == "weight")].set_index("module")
    table = pd.DataFrame(
        {
            "train_act_std": activation.get("train"),
            "eval_act_std": activation.get("eval"),
            "update/weight": updates.l2 / weights.l2,
        }
    )
    print(f"\nlayers at step {last.step.max()}:")
    print(table.to_string(float_format="{:.3g}".format, na_rep="-"))


if __name__ == "__main__":
    main()
