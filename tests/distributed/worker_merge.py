"""torchrun worker: ``ranks="merge"`` on DDP or FSDP2, and what the merged rows should hold.

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker_merge.py KIND DIR

Each rank trains the tiny model on its own batches (under DDP, rank 0 alone also evaluates
after step 1), watched with ``ranks="merge"`` into ``DIR/run``, while the worker keeps its
own references: each layer's activation on this rank (gathered afterwards into the whole
batch's), and each parameter whole after each step (``full_tensor()`` of FSDP2's shards, a
collective both ranks run). Then the same training again with ``ranks="each"`` into
``DIR/each``. Rank 0 writes ``DIR/expected.json`` (float64 numpy statistics of the
concatenated activations and of the whole parameters), ``DIR/loaded.json`` (what
``layerscope.load`` reads of the merged run) and ``DIR/each_merged.json`` (the other run,
loaded with ``ranks="merge"``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from training_job import batches, reference_stats, save_loaded_run, start, write_json
from worker_train import wrapped

import layerscope


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def run_job(
    kind: str,
    rank: int,
    run: str,
    ranks: str,
    after_step: Callable[[int], None] = lambda step: None,
    models: tuple[nn.Module, nn.Module] | None = None,
) -> layerscope.Scope:
    """Train the job's model on this rank's batches, watched into ``run``; its scope.

    ``after_step(step)`` runs after each optimizer step (the references' reads); ``models``
    is the model to train and the module named in the run (a fresh one if not given). Under
    DDP, rank 0 alone evaluates after step 1: rows rank 1 never has, merged all the same.
    """
    model, inner = models or wrapped(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kinds = ("activation", "weight")
    with layerscope.watch(
        model, optimizer=optimizer, every=1, run=run, ranks=ranks, kinds=kinds, alerts=False
    ) as scope:
        for step, x in enumerate(batches(rank)):
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if kind == "ddp" and step == 1 and rank == 0:
                inner.eval()
                with torch.no_grad():
                    inner(x[:3])
                inner.train()
            after_step(step)
    return scope


class References:
    """Each layer's outputs on this rank, and each parameter whole after each step."""

    def __init__(self, inner: nn.Module) -> None:
        self.inner = inner
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self.weights: list[dict[str, Any]] = []
        self.step = 0
        self.handles = [m.register_forward_hook(self._keep(n)) for n, m in inner.named_children()]

    def _keep(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            phase = "train" if module.training else "eval"
            key = f"{phase}/{self.step}/{name}"
            self.outputs.setdefault(key, []).append(output.detach().clone())

        return hook

    def after_step(self, step: int) -> None:
        for name, param in self.inner.named_parameters():
            full = whole(param.detach())  # a collective under FSDP2: every rank
            module, _, tensor = name.rpartition(".")
            self.weights.append(
                {"step": step, "module": module, "tensor": tensor} | reference_stats(full)
            )
        self.step = step + 1

    def activations(self, world: int, rank: int) -> list[dict[str, Any]] | None:
        """Rank 0: statistics of each output over every rank's batch; None elsewhere."""
        for handle in self.handles:
            handle.remove()
        gathered: list[Any] = [None] * world
        mine = {key: [tensor.tolist() for tensor in kept] for key, kept in self.outputs.items()}
        dist.all_gather_object(gathered, mine)
        if rank != 0:
            return None
        rows = []
        for key in sorted(gathered[0]):
            phase, step, module = key.split("/")
            parts = [torch.tensor(t) for per in gathered for t in per.get(key, [])]
            flat = torch.cat([part.reshape(-1) for part in parts])
            rows.append(
                {"phase": phase, "step": int(step), "module": module} | reference_stats(flat)
            )
        return rows


def main(kind: str, directory: str) -> None:
    rank, world = start()
    try:
        model, inner = wrapped(kind)
        references = References(inner)
        run = f"{directory}/run"
        scope = run_job(kind, rank, run, "merge", references.after_step, (model, inner))
        activations = references.activations(world, rank)
        if rank == 0:
            write_json(
                f"{directory}/expected.json",
                {
                    "activations": activations,
                    "weights": references.weights,
                    "failures": scope.failures,
                },
            )
        # The same training again, each rank's rows its own: merged by the reader instead.
        run_job(kind, rank, f"{directory}/each", "each")
        dist.barrier()  # every rank has closed its scopes
        if rank == 0:
            save_loaded_run(f"{directory}/run", f"{directory}/loaded.json")
            save_loaded_run(f"{directory}/each", f"{directory}/each_merged.json", ranks="merge")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
