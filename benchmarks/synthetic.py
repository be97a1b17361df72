"""Write a large run quickly, without training: for benchmarks of what reads runs.

    from synthetic import write_ranks, write_run
    write_run("/tmp/big", layers=200, steps=5000)
    write_ranks("/tmp/job", ranks=8, layers=250, steps=1250)  # 10 M rows, 8 ranks

The run is what ``layerscope.watch`` would write for a stack of ``layers`` Linear layers with
every step recorded: the same tables, ``run.json`` and ``modules.json``, written through the
store's own writer. Statistics drift plausibly over steps (activations widen, gradients shrink,
a few layers die), histograms are log2 bumps around each tensor's scale, and the scalars are a
falling loss and a learning rate, so figures and dashboards show something.

``write_ranks`` writes the run of a data-parallel job: each rank's files written by the
store as that rank of a torchrun job writes them (``JobRank`` tells the store its rank), one
rank after another in this process. About 3.5 s of CPU per million rows with one torch thread
(``OMP_NUM_THREADS=1``; more threads only spin on a shared machine).
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


# Each kind's scale is a factor of depth times a factor of progress through the run: activations
# widen, gradients shrink, weights grow a little.
def _depth_scale(depth: torch.Tensor) -> torch.Tensor:
    """``(layers, 4)``: each layer's scale per kind, before the run's progress."""
    return torch.stack(
        [
            0.5 * (1 + depth),
            1e-3 * (4.0 ** -(depth * 3)),
            0.1 * torch.ones_like(depth),
            1e-2 * (4.0 ** -(depth * 2)),
        ],
        dim=1,
    )


def _progress_scale(progress: torch.Tensor) -> torch.Tensor:
    """``(steps, 4)``: each step's factor per kind."""
    return torch.stack(
        [1 + 2 * progress, 1 - 0.8 * progress, 1 + 0.3 * progress, 1 - 0.9 * progress], dim=1
    )


class JobRank(ProcessRank):
    """Rank ``rank`` of a job of ``world_size`` processes, as torchrun's environment says it.

    The store asks the run's place for its rank (``peek``, ``fix``); this one answers the
    given rank, so that one process can write each rank's files in turn.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__()
        self._given = (rank, world_size)

    def peek(self) -> tuple[int, int]:
        return self._given

    def fix(self) -> tuple[int, int]:
        return self._given


class _RankRows:
    """Finalised rows of one rank, a chunk of steps at a time.

    Histograms are 256 slots wide as the writer takes them, and mostly zero: they are set in
    one buffer, zeroed again between chunks, rather than allocated (and faulted in) anew.
    Data-parallel ranks see other batches, so rank ``r``'s activations and gradients are
    ``2 r`` percent wider than rank 0's; weights are the same on every rank.
    """

    def __init__(self, layers: int, steps: int, rank: int, most_steps: int) -> None:
        self.layers, self.steps, self.rank = layers, steps, rank
        self.identities = Identities()
        self.codes = torch.tensor(
            [
                self.identities.code(
                    Identity("train", f"layers.{layer}", "Linear", Kind(kind), tensor, 0)
                )
                for layer in range(layers)
                for kind in KINDS
                for tensor in ["out" if kind in ("activation", "grad") else "weight"]
            ]
        )
        self.identities.form_code(Form("float32", (64, WIDTH_FEATURES)))
        depth = torch.arange(layers, dtype=torch.float64) / max(layers - 1, 1)
        self._depth = _depth_scale(depth)
        self._depth[:, :2] *= 1 + 0.02 * rank
        self._hist = torch.zeros(most_steps * layers * len(KINDS), SLOTS, dtype=torch.float64)
        self._set: torch.Tensor | None = None  # flat positions the last chunk set

    def chunk(self, first: int, count: int) -> StatsRows:
        """Rows of ``count`` steps from ``first``; its ``hist`` holds until the next call."""
        per_step = len(self.codes)
        step_of = torch.arange(first, first + count, dtype=torch.float64)
        progress = _progress_scale(step_of / max(self.steps - 1, 1))
        std = (progress[:, None, :] * self._depth[None, :, :]).reshape(-1)
        rows = len(std)
        step = torch.arange(first, first + count).repeat_interleave(per_step)
        layer = torch.arange(self.layers).repeat_interleave(len(KINDS)).repeat(count)
        kind = torch.arange(len(KINDS)).repeat(count * self.layers)
        # Every 17th layer dies over the run: its activations' zero fraction climbs to 0.9.
        dying = (layer % 17 == 5) & (kind == 0)
        zero_frac = torch.where(dying, 0.9 * step.double() / max(self.steps - 1, 1), 0.0)
        partials = torch.zeros(rows, WIDTH, dtype=torch.float64)
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
        return StatsRows(
            step=step,
            identity=self.codes.repeat(count),
            form=torch.zeros(rows, dtype=torch.int64),
            identities=self.identities,
            rank=self.rank,
            stats={
                "numel": stats["numel"],
                **{name: stats[name] for name in layerscope.stats.BUILTIN_STATS if name != "hist"},
            },
            hist=self._histograms(std, live, partials[:, Field.ZEROS]),
        )

    def _histograms(
        self, std: torch.Tensor, live: torch.Tensor, zeros: torch.Tensor
    ) -> torch.Tensor:
        """A bump of 8 slots around each tensor's scale, summing to its live elements."""
        if self._set is not None:
            self._hist.view(-1)[self._set] = 0
            self._hist[:, 0] = 0
        rows = len(std)
        centre = (torch.log2(std).floor() + 127).long().clamp(4, SLOTS - 5)
        weights = torch.tensor([1, 3, 8, 14, 14, 8, 3, 1], dtype=torch.float64)
        share = torch.floor(live[:, None] * weights / weights.sum())
        share[:, 3] += live - share.sum(dim=1)
        slots = centre[:, None] + torch.arange(-4, 4)
        self._set = (torch.arange(rows)[:, None] * SLOTS + slots).reshape(-1)
        hist = self._hist[:rows]
        hist.view(-1)[self._set] = share.reshape(-1)
        hist[:, 0] += zeros  # zeros fall in slot 0
        return hist


def _scalars(first: int, count: int, steps: int) -> list[tuple[int, str, float]]:
    """A falling loss and a learning rate that warms up over 100 steps."""
    scalars = []
    for step in range(first, first + count):
        scalars.append((step, "loss", 2.5 * math.exp(-step / max(steps / 3, 1)) + 0.1))
        scalars.append((step, "lr", 1e-3 * min(1.0, (step + 1) / 100)))
    return scalars


def _alerts(first: int, count: int, layers: int, steps: int) -> list[Alert]:
    """One alert per dying layer, half way through its dying."""
    return [
        Alert(step, "train", "dead", f"layers.{layer}", "activation", "out", "warning",
              0.5, 0.5, f"layers.{layer}: half its activations are zero")
        for layer in range(5, layers, 17)
        for step in [steps // 2 + layer]
        if first <= step < first + count
    ]  # fmt: skip


def _write_rank(
    path: Path,
    place: ProcessRank,
    rank: int,
    shape: tuple[int, int, int],
    name: str,
    started: float,
) -> None:
    """Write one rank's files through the store, as that rank's writer thread would."""
    layers, steps, steps_per_segment = shape
    rows = _RankRows(layers, steps, rank, steps_per_segment)
    store = ParquetStore(path, name=name)
    store.start(
        RunInfo(
            id=f"synthetic-{layers}x{steps}",
            name=name,
            started=started,
            place=place,
            config={"stats": list(layerscope.stats.BUILTIN_STATS), "custom_stats": []},
            modules=modules(layers),
            histogram_edges=layerscope.stats.log2_bin_edges(),
        )
    )
    for first in range(0, steps, steps_per_segment):
        count = min(steps_per_segment, steps - first)
        chunk = rows.chunk(first, count)
        alerts = _alerts(first, count, layers, steps)
        store.write(Records(stats=chunk, scalars=_scalars(first, count, steps), alerts=alerts))
        store.flush()
    store.close(
        RunSummary(
            status="finished",
            ended=time.time(),
            steps=steps,
            recorded_rows=steps * len(rows.codes),
            dropped_rows=0,
            failures=0,
        )
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
    shape = (layers, steps, steps_per_segment)
    _write_rank(path, ProcessRank(), 0, shape, name or path.name, time.time())
    return path


def write_ranks(
    directory: str | os.PathLike[str],
    *,
    ranks: int,
    layers: int = 200,
    steps: int = 5000,
    segment_rows: int = 1 << 17,
    name: str | None = None,
) -> Path:
    """Write a run of a data-parallel job of ``ranks`` ranks; return its path.

    Each rank's files are written by the store as rank ``r`` of a torchrun job writes them:
    rank 0's at the root, rank ``r``'s in ``rank-0000r/``. Each rank has ``layers * steps * 4``
    rows, in segments of about ``segment_rows`` rows, compacted when its store closes.
    """
    path = Path(directory)
    steps_per_segment = max(1, min(steps, segment_rows // (layers * len(KINDS))))
    started = time.time()
    for rank in range(ranks):
        shape = (layers, steps, steps_per_segment)
        _write_rank(path, JobRank(rank, ranks), rank, shape, name or path.name, started)
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--ranks", type=int, help="write a job of this many ranks")
    args = parser.parse_args()
    begin = time.perf_counter()
    if args.ranks is None:
        written = write_run(args.directory, layers=args.layers, steps=args.steps)
    else:
        shape = {"layers": args.layers, "steps": args.steps}
        written = write_ranks(args.directory, ranks=args.ranks, **shape)
    print(f"{written}: {time.perf_counter() - begin:.1f} s")
