"""Step-time overhead of layerscope and its peers, as a ratio to the unwatched step, in one process.

Every configuration trains a fresh copy of the model in each round (where a copy's memory lies
makes it faster or slower for as long as it lives); rounds interleave the configurations, in a
new order each round. Within a round, each configuration's mean step time is divided by
the mean of two unwatched copies' (a shared machine's speed drifts between rounds, not within
one); the figure is the median of these ratios over rounds. The second unwatched copy against
the first is the noise floor. Peers that are not installed are skipped.

    python benchmarks/overhead.py                       # cnn, gpt and mlp, prints the table
    python benchmarks/overhead.py --workloads cnn       # one workload
    python benchmarks/overhead.py --workloads scale     # 250 small blocks: cost per module
    python benchmarks/overhead.py --write               # also updates BENCHMARKS.md
    python benchmarks/overhead.py --clock process --threads 1  # CPU seconds: on a busy host

``--clock process`` times the process's CPU seconds, all its threads together, instead of the
wall clock: other processes disturb it far less (on a host whose tasks waited for a CPU 97%
of the time, the noise floor was 0.96x to 1.01x against 0.43x to 4.1x by the wall clock).
Use it with one thread: with more, torch's threads count their waiting for each other too.

``scale`` (250 residual blocks of Linear(64, 64), LayerNorm and GELU, batch 4: 1,251 modules,
750 of them watched) is where the cost per hooked module dominates the step; it trains on one
thread whatever ``--threads`` says (see workloads.py). It is not among the defaults: the peers'
histograms of its 1,000 parameters and their gradients take seconds a step, and on a 2-core
machine a round takes about 55 s: ``--rounds 7`` took 6.3 minutes, ``--rounds 11`` alone takes
about 10.
``--write`` replaces the whole "Step-time overhead" section: run it without ``--write``, or
with the other workloads named too. Its cost per module alone, in seconds a round:

    python benchmarks/overhead.py --workloads scale --configs "hooks idle" --rounds 11

The row "hooks idle, cost per watched module (us)" is (hooks idle - unwatched) / the number
of modules layerscope watches (its default selection), in microseconds: an unrecorded step's
cost spread over its modules. On models of few modules it also carries the per-step costs
(the entry hook, the optimizer's hooks, the probe's) and the noise floor, divided by few:
read it on ``scale``.

Rows "every 10 steps" and "defaults" are derived from the measured rows: a recorded fraction f
of steps costs (1 - f) * between + f * full, where "between" is the unrecorded step: hooks idle
(the default on the CPU, where the sentinel is off unless asked for) or the sentinel.
``every=None`` is layerscope's DEFAULT_SCHEDULE: f = 1/every in the long run, and over the
first 100 steps the dense steps plus every ``every``-th after them.
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import layerscope
import report
from layerscope._schedule import DEFAULT_SCHEDULE
from layerscope.model import DEFAULT_KINDS
from peers import PEERS, quiet
from report import replace_section
from workloads import WORKLOADS, Workload  # run as a script


@dataclass
class Session:
    after_step: Callable[[torch.Tensor], None]
    settle: Callable[[], None]
    close: Callable[[], None]
    watched: int = 0  # modules that layerscope hooks; 0 for a peer


def _layerscope(**options: Any) -> Callable[[torch.nn.Module, Any], Session]:
    def start(model: torch.nn.Module, optimizer: Any) -> Session:
        scope = layerscope.watch(model, optimizer=optimizer, **options)
        watched = sum(info.watched for info in scope.modules)
        return Session(lambda loss: None, scope.flush, scope.close, watched)

    return start


def _peer(cls: Any) -> Callable[[torch.nn.Module, Any], Session]:
    def start(model: torch.nn.Module, optimizer: Any) -> Session:
        peer = cls(model, optimizer)
        return Session(after_step=peer.after_step, settle=peer.settle, close=peer.close)

    return start


IDLE = "layerscope: hooks idle (an unrecorded step, no sentinel)"
SENTINEL = "layerscope: sentinel alone (an unrecorded step)"
GRADIENT_SENTINEL = "layerscope: gradients' sentinel alone (an unrecorded step)"
FULL = "layerscope: full, every step"
IDLE_UPDATE = "layerscope: hooks idle, capturing update too (an unrecorded step, no sentinel)"
FULL_UPDATE = "layerscope: full with update, every step"
WITH_UPDATE = [*(kind.value for kind in DEFAULT_KINDS), "update"]
SECOND_COPY = "unwatched, a second copy against the first (the noise floor: ideally 1.00x)"
CONFIGS: dict[str, Callable[[torch.nn.Module, Any], Session] | None] = {
    "unwatched": None,
    SECOND_COPY: None,
    # Step 0, the warm-up step, is recorded, and none after it: the unrecorded steps that
    # follow are those of the default schedule, the first step's call-order hooks gone.
    IDLE: _layerscope(every=layerscope.Schedule(every=10**9, sentinel=False)),
    SENTINEL: _layerscope(every=layerscope.Schedule(every=10**9, sentinel=True)),
    GRADIENT_SENTINEL: _layerscope(every=layerscope.Schedule(every=10**9, sentinel="gradients")),
    FULL: _layerscope(every=1),
    # The default kinds and the optimizer's update: on a recorded step, one copy of the
    # parameters before the step, and after minus before in place in it.
    IDLE_UPDATE: _layerscope(
        every=layerscope.Schedule(every=10**9, sentinel=False), kinds=WITH_UPDATE
    ),
    FULL_UPDATE: _layerscope(every=1, kinds=WITH_UPDATE),
    "layerscope: full, every kind (adds input, update, buffer), every step": _layerscope(
        every=1, kinds=[kind.value for kind in layerscope.Kind]
    ),
    "layerscope: weights + grads, every step (wandb's coverage)": _layerscope(
        every=1, kinds=("weight", "weight_grad")
    ),
    "layerscope: inputs, outputs, weights, grads, every step (torchember's coverage)": (
        _layerscope(every=1, kinds=("input", "activation", "weight", "weight_grad"))
    ),
    # torchember keeps mean, std, max and min of each tensor, no histogram: the same here.
    "layerscope: torchember's coverage and its 4 statistics, no histogram": _layerscope(
        every=1,
        kinds=("input", "activation", "weight", "weight_grad"),
        stats=["mean", "std", "min", "max"],
        histogram=None,
    ),
    **{name: _peer(cls) for name, cls in PEERS.items()},
}


class Trainer:
    def __init__(self, workload: Workload, model: torch.nn.Module, start: Any) -> None:
        self.workload = workload
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        with quiet():
            self.session = start(model, self.optimizer) if start is not None else None
        self.generator = torch.Generator().manual_seed(0)

    def steps(self, count: int) -> float:
        """Mean seconds per step over ``count`` steps."""
        batches = [self.workload.make_batch(self.generator) for _ in range(count)]
        # The garbage of making this copy and of the last block is collected now, not in a
        # timed step: on a model of 1,000 modules a full collection takes tens of ms.
        gc.collect()
        start = clock()
        with quiet():
            for x, y in batches:
                loss = self.workload.loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                if self.session is not None:
                    self.session.after_step(loss)
                self.optimizer.zero_grad()
            # Work left to a background thread is part of the cost, and must not spill into
            # the next configuration's timing.
            if self.session is not None:
                self.session.settle()
        return (clock() - start) / count

    def close(self) -> None:
        if self.session is not None:
            with quiet():
                self.session.close()


BLOCK_SECONDS = 0.4
# What a block's time is read from: wall-clock seconds, or (--clock process) the CPU seconds of
# every thread of this process, the writer's too, which other processes on a busy host
# disturb far less.
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
clock = CLOCKS["wall"]


def measure(workload: Workload, rounds: int, steps: int) -> tuple[dict[str, float], list[str], int]:
    """Step times by configuration, the peers skipped, and how many modules layerscope hooks."""
    torch.manual_seed(0)
    model = workload.make_model()
    starts, skipped, watched = {}, [], 0
    for name, start in CONFIGS.items():
        try:
            trainer = Trainer(workload, copy.deepcopy(model), start)
            if name == IDLE and trainer.session is not None:
                watched = trainer.session.watched
            trainer.close()
            starts[name] = start
        except ImportError as error:
            skipped.append(f"{name}: not installed ({error.name})")
    # Blocks of at least BLOCK_SECONDS of unwatched training, so that a short step's block
    # is not at the mercy of one interruption.
    probe = Trainer(workload, copy.deepcopy(model), None)
    probe.steps(1)
    step_time = probe.steps(3)
    steps = max(steps, math.ceil(BLOCK_SECONDS / step_time))
    times: dict[str, list[float]] = {name: [] for name in starts}
    order = list(starts)
    shuffle = random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)  # no configuration always follows the same one
        for name in order:
            # A fresh copy every round: where a copy's memory lies makes it faster or slower
            # by up to 10% for as long as it lives, and that must not follow a configuration.
            trainer = Trainer(workload, copy.deepcopy(model), starts[name])
            trainer.steps(1)  # warm up allocator, dispatcher and the peers' first-call work
            times[name].append(trainer.steps(steps))
            trainer.close()
    # Ratios are taken within each round, to the mean of the two unwatched copies, and their
    # median is reported: the machine's speed drifts (on a shared host by 2x over a minute),
    # and a ratio within one round sees one speed. Returned as times: median ratio x median
    # base, so that dividing by "unwatched" gives the ratio back.
    first, second = times["unwatched"], times[SECOND_COPY]
    bases = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
    base = statistics.median(bases)
    results = {
        name: base * statistics.median(t / b for t, b in zip(values, bases, strict=True))
        for name, values in times.items()
    }
    results["unwatched"] = base
    results[SECOND_COPY] = base * statistics.median(
        b / a for a, b in zip(first, second, strict=True)
    )
    return results, skipped, watched


def _per_module(results: dict[str, dict[str, float]], watched: dict[str, int]) -> list[str]:
    """(hooks idle - unwatched) / watched modules, in microseconds, with the module count."""
    cells = []
    for name, times in results.items():
        cost = (times[IDLE] - times["unwatched"]) / watched[name] * 1e6
        cells.append(f"{cost:.2f} ({watched[name]:,} modules)")
    return cells


def cpu_wait() -> float:
    """Seconds that some task has waited for a CPU since boot (Linux PSI), or NaN."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return math.nan
    return int(line.rsplit("total=", 1)[1]) / 1e6


def _first_100() -> float:
    """The fraction of the first 100 steps that the default schedule records."""
    return sum(DEFAULT_SCHEDULE.records(step) for step in range(100)) / 100


PER_MODULE = "hooks idle, cost per watched module (us)"
DESCRIPTIONS = {
    "cnn": "CNN = 5 stride-2 convs, batch 256, 1x28x28",
    "gpt": "GPT = 4 blocks, d=256, 4 heads, sequence 128, batch 8, tied embedding",
    "mlp": "MLP = 6 x Linear(1024), batch 128",
    "scale": "scale = 250 residual blocks of Linear(64, 64), LayerNorm and GELU, batch 4, on "
    "1 thread",
}


def table(results: dict[str, dict[str, float]], watched: dict[str, int]) -> str:
    names = list(results)
    lines = [
        "| configuration | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| unwatched step | "
        + " | ".join(f"{results[n]['unwatched'] * 1e3:.1f} ms" for n in names)
        + " |",
    ]
    configs = [name for name in CONFIGS if name != "unwatched"]
    for config in configs:
        cells = []
        for name in names:
            value = results[name].get(config)
            cells.append(
                "skipped" if value is None else f"{value / results[name]['unwatched']:.2f}x"
            )
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
        if config == IDLE:
            lines.append(f"| {PER_MODULE} | " + " | ".join(_per_module(results, watched)) + " |")
    sparse = 1 / DEFAULT_SCHEDULE.every
    for label, between, recorded, fraction in (
        ("layerscope: full, every 10 steps (derived)", IDLE, FULL, 1 / 10),
        ("layerscope: full, every 10 steps, sentinel between (derived)", SENTINEL, FULL, 1 / 10),
        ("layerscope: defaults, long run (derived)", IDLE, FULL, sparse),
        ("layerscope: defaults, first 100 steps (derived)", IDLE, FULL, _first_100()),
        (
            "layerscope: defaults with sentinel=True, long run (derived)",
            SENTINEL,
            FULL,
            1 / DEFAULT_SCHEDULE.every,
        ),
        ("layerscope: defaults with update, long run (derived)", IDLE_UPDATE, FULL_UPDATE, sparse),
        (
            "layerscope: defaults with update, first 100 steps (derived)",
            IDLE_UPDATE,
            FULL_UPDATE,
            _first_100(),
        ),
    ):
        if any(needed not in results[names[0]] for needed in (between, recorded)):
            continue  # not measured in this run (--configs)
        cells = []
        for name in names:
            base = results[name]["unwatched"]
            other, full = results[name][between] / base, results[name][recorded] / base
            cells.append(f"{(1 - fraction) * other + fraction * full:.3f}x")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads",
        nargs="*",
        default=["cnn", "gpt", "mlp"],
        choices=list(WORKLOADS),
        help="cnn, gpt and mlp by default; scale (250 small blocks) only when named",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall-clock step time (the default), or the process's CPU time on a busy host",
    )
    parser.add_argument(
        "--configs", nargs="*", help="only configurations whose name contains one of these"
    )
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.configs:
        for name in list(CONFIGS):
            keep = name in ("unwatched", SECOND_COPY) or any(p in name for p in args.configs)
            if not keep:
                del CONFIGS[name]

    results, skipped, watched = {}, set(), {}
    for name in args.workloads:
        torch.set_num_threads(WORKLOADS[name].threads or args.threads)
        began, waited = time.perf_counter(), cpu_wait()
        results[name], missing, watched[name] = measure(WORKLOADS[name], args.rounds, args.steps)
        skipped.update(missing)
        took = time.perf_counter() - began
        # Above a few percent, other processes took cores (layerscope's writer thread and the
        # peers' own threads add some): compare with another run before trusting the ratios.
        print(
            f"{name}: done in {took:.0f} s; some task waited for a CPU "
            f"{(cpu_wait() - waited) / took:.0%} of that time",
            file=sys.stderr,
        )
    text = table(results, watched)
    if skipped:
        text += "\n\nSkipped: " + "; ".join(sorted(skipped)) + "."
    print(text)
    if args.write:
        command = report.command("overhead.py")
        machine = report.machine(args.threads)
        replace_section(
            "Step-time overhead (CPU)",
            f"Machine: {machine}. Command: `{command}`.\n"
            + ("Step times in the process's CPU seconds. " if args.clock == "process" else "")
            + f"Medians over {args.rounds} interleaved rounds, in a new order each round, of at "
            f"least {args.steps} steps and {BLOCK_SECONDS} s of unwatched training per block; "
            "background work of a configuration (layerscope's writer, TensorBoard's event "
            "writer, wandb's process) finishes inside its block. Every block trains a fresh "
            "copy of the model, after one warm-up step and a garbage collection. "
            "Each figure is the median over rounds of a ratio within one round, to the mean of "
            "two unwatched copies of the model (the machine's speed drifts between rounds). "
            f"Workloads: {'; '.join(DESCRIPTIONS[name] for name in args.workloads)}. AdamW. "
            "layerscope's full configuration"
            " records activation, grad, weight and weight_grad with every statistic and the log2 "
            "histogram. Peers: wandb offline; TensorBoard `add_histogram` of every parameter and "
            "gradient; torchember's own hooks plus `log_model()`; torchfunc ForwardOutput and "
            "BackwardOutput recorders keeping the latest tensor; the textbook "
            "baseline is hooks with one `.item()` per statistic.\n\n"
            f"{text}",
        )


if __name__ == "__main__":
    main()
