"""Write a large run quickly, without training: for benchmarks of what reads runs.

    from synthetic import write_run
    write_run("/tmp/big", layers=200, steps=5000)

The run is what ``layerscope.watch`` would write for a stack of ``layers`` Linear layers with
every step recorded: the same tables, ``run.json`` and ``modules.json``, written through the
store's own writer. Statistics drift plausibly over steps (activations widen, gradients shrink,
a few layers die), histograms are log2 bumps around each tensor's scale, and the scalars are a
falling loss and a learning rate, so figures and dashboards show something.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

import layerscope
from layerscope.distributed._ranks import ProcessRank
from layerscope.health._alert import Alert
from layerscope.model._identities import Form, Identities, Identity
from layerscope.model._kinds import Kind
from layerscope.model._modules import ModuleInfo
from layerscope.sinks import Records, RunInfo, RunSummary, StatsRows
from layerscope.stats import finalize
from layerscope.stats._layout import WIDTH, Field
from layerscope.store import ParquetStore

KINDS = ("activation", "grad", "weight", "weight_grad")
WIDTH_FEATURES = 64
ELEMENTS = 4096  # elements of every tensor
SLOTS = 256  # log2 histogram slots; slot 127 holds magnitudes in [1, 2)


def modules(layers: int) -> list[ModuleInfo]:
    """The module tree: a root Sequential ``""`` over ``layers.0`` ... ``layers.{n-1}``."""
    shape = (WIDTH_FEATURES, WIDTH_FEATURES)
    per_layer = WIDTH_FEATURES * WIDTH_FEATURES + WIDTH_FEATURES
    names = tuple(f"layers.{index}" for index in range(layers))
    root = ModuleInfo("", "Sequential", {}, 0, per_layer * layers, names, False)
    leaves = [
        ModuleInfo(name, "Linear", {"weight": shape, "bias": (WIDTH_FEATURES,)}, per_layer,
                   per_layer, (), True)
        for name in names
    ]  # fmt: skip
    return [root, *leaves]


def _scale(layer: torch.Tensor, kind: int, step: torch.Tensor, layers: int, steps: int):
    """Each row's standard deviation: a trend per kind over steps, a slope over depth."""
    depth = layer / max(layers - 1, 1)
    progress = step / max(steps - 1, 1)
    if KINDS[kind] == "activation":
        return 0.5 * (1 + depth) * (1 + 2 * progress)
    if KINDS[kind] == "grad":
        return 1e-3 * (4.0 ** -(depth * 3)) * (1 - 0.8 * progress)
    if KINDS[kind] == "weight":
        return 0.1 * (1 + 0.3 * progress) * torch.ones_like(depth)
    return 1e-2 * (4.0 ** -(depth * 2)) * (1 - 0.9 * progress)


def _chunk(
    first: int, count: int, layers: int, steps: int, identities: Identities, codes: list[int]
) -> StatsRows:
    """Finalised rows of ``count`` steps from ``first``: every layer and kind of each step."""
    per_step = len(codes)
    index = torch.arange(count * per_step)
    step = first + index // per_step
    layer = (index % per_step) // len(KINDS)
    kind = index % len(KINDS)
    std = torch.empty(len(index), dtype=torch.float64)
    for k in range(len(KINDS)):
        rows = kind == k
        std[rows] = _scale(layer[rows].double(), k, step[rows].double(), layers, steps)
    # Every 17th layer dies over the run: its activations' zero fraction climbs to 0.9.
    dying = (layer % 17 == 5) & (kind == 0)
    zero_frac = torch.where(dying, 0.9 * step.double() / max(steps - 1, 1), 0.0)
    partials = torch.zeros(len(index), WIDTH, dtype=torch.float64)
    partials[:, Field.NUMEL] = partials[:, Field.COUNT] = ELEMENTS
    partials[:, Field.MEAN] = 0.1 * std * torch.sin(layer.double() + step.double() / 500)
    partials[:, Field.M2] = (ELEMENTS - 1) * std**2
    partials[:, Field.MIN] = partials[:, Field.MEAN] - 3 * std
    partials[:, Field.MAX] = partials[:, Field.MEAN] + 3 * std
    partials[:, Field.ZEROS] = torch.round(zero_frac * ELEMENTS)
    live = ELEMENTS - partials[:, Field.ZEROS]
    partials[:, Field.NEG] = torch.floor(live / 2)
    partials[:, Field.POS] = live - partials[:, Field.NEG]
    stats = finalize(partials)
    # A bump of 8 slots around each tensor's scale, its counts summing to the live elements.
    centre = (torch.log2(std).floor() + 127).long().clamp(4, SLOTS - 5)
    weights = torch.tensor([1, 3, 8, 14, 14, 8, 3, 1], dtype=torch.float64)
    hist = torch.zeros(len(index), SLOTS, dtype=torch.float64)
    share = torch.floor(live[:, None] * weights / weights.sum())
    share[:, 3] += live - share.sum(dim=1)
    hist.scatter_(1, centre[:, None] + torch.arange(-4, 4), share)
    hist[:, 0] += partials[:, Field.ZEROS]  # zeros fall in slot 0
    return StatsRows(
        step=step,
        identity=torch.tensor(codes)[index % per_step],
        form=torch.zeros(len(index), dtype=torch.int64),
        identities=identities,
        rank=0,
        stats={
            "numel": stats["numel"],
            **{name: stats[name] for name in layerscope.stats.BUILTIN_STATS if name != "hist"},
        },
        hist=hist,
    )


def write_run(
    directory: str | os.PathLike[str],
    *,
    layers: int = 200,
    steps: int = 5000,
    steps_per_segment: int = 100,
    name: str | None = None,
) -> Path:
    """Write a run of ``layers`` layers by ``steps`` recorded steps, 4 kinds; return its path.

    ``layers * steps * 4`` rows of statistics with log2 histograms, loss and lr scalars for
    every step and one alert per dying layer.
    """
    path = Path(directory)
    identities = Identities()
    codes = [
        identities.code(Identity("train", f"layers.{layer}", "Linear", Kind(kind), tensor, 0))
        for layer in range(layers)
        for kind in KINDS
        for tensor in ["out" if kind in ("activation", "grad") else "weight"]
    ]
    identities.form_code(Form("float32", (64, WIDTH_FEATURES)))
    store = ParquetStore(path, name=name or path.name)
    started = time.time()
    store.start(
        RunInfo(
            id=f"synthetic-{layers}x{steps}",
            name=name or path.name,
            started=started,
            place=ProcessRank(),
            config={"stats": list(layerscope.stats.BUILTIN_STATS), "custom_stats": []},
            modules=modules(layers),
            histogram_edges=layerscope.stats.log2_bin_edges(),
        )
    )
    for first in range(0, steps, steps_per_segment):
        count = min(steps_per_segment, steps - first)
        scalars = []
        for step in range(first, first + count):
            scalars.append((step, "loss", 2.5 * math.exp(-step / max(steps / 3, 1)) + 0.1))
            scalars.append((step, "lr", 1e-3 * min(1.0, (step + 1) / 100)))
        alerts = [
            Alert(step, "train", "dead", f"layers.{layer}", "activation", "out", "warning",
                  0.5, 0.5, f"layers.{layer}: half its activations are zero")
            for layer in range(5, layers, 17)
            for step in [steps // 2 + layer]
            if first <= step < first + count
        ]  # fmt: skip
        chunk = _chunk(first, count, layers, steps, identities, codes)
        store.write(Records(stats=chunk, scalars=scalars, alerts=alerts))
        store.flush()
    store.close(
        RunSummary(
            status="finished",
            ended=time.time(),
            steps=steps,
            recorded_rows=steps * len(codes),
            dropped_rows=0,
            failures=0,
        )
    )
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    begin = time.perf_counter()
    written = write_run(args.directory, layers=args.layers, steps=args.steps)
    print(f"{written}: {time.perf_counter() - begin:.1f} s")
