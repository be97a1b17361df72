"""Step-time overhead of layerscope, as a ratio to the unwatched step, in one process.

Every configuration trains its own copy of the model; rounds interleave the configurations
(A B C A B C ...) and the figure is the median over rounds of each one's mean step time, so
drift on a shared machine hits all of them alike.

    python benchmarks/overhead.py                 # all workloads, prints a table
    python benchmarks/overhead.py --write         # also rewrites BENCHMARKS.md

Configurations:
- unwatched: no layerscope at all;
- hooks idle: watched, but on a step the schedule does not record (the cost of every
  unrecorded step);
- full, every step: every default kind, all statistics and the log2 histogram;
- defaults (derived): ``every=None`` is Schedule(every=50, dense=10); in the long run one step
  in 50 is recorded, so its cost is (49 * idle + 1 * full) / 50 of the unwatched step; over the
  first 100 steps 12 are recorded.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import layerscope
from report import replace_section
from workloads import WORKLOADS, Workload  # run as a script

CONFIGS = ("unwatched", "hooks idle", "full, every step")


class Trainer:
    def __init__(self, workload: Workload, model: torch.nn.Module, config: str) -> None:
        self.workload = workload
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.scope = None
        if config == "hooks idle":
            never = layerscope.Schedule(start=10**9)
            self.scope = layerscope.watch(model, optimizer=self.optimizer, every=never)
        elif config == "full, every step":
            self.scope = layerscope.watch(model, optimizer=self.optimizer, every=1)
        self.generator = torch.Generator().manual_seed(0)

    def steps(self, count: int) -> float:
        """Mean seconds per step over ``count`` steps."""
        batches = [self.workload.make_batch(self.generator) for _ in range(count)]
        start = time.perf_counter()
        for x, y in batches:
            loss = self.workload.loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        return (time.perf_counter() - start) / count


def measure(workload: Workload, rounds: int, steps: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = workload.make_model()
    trainers = {config: Trainer(workload, copy.deepcopy(model), config) for config in CONFIGS}
    for trainer in trainers.values():
        trainer.steps(2)  # warm up allocator and dispatcher
    times: dict[str, list[float]] = {config: [] for config in CONFIGS}
    for _ in range(rounds):
        for config, trainer in trainers.items():
            times[config].append(trainer.steps(steps))
    for trainer in trainers.values():
        if trainer.scope is not None:
            trainer.scope.close()
    return {config: statistics.median(values) for config, values in times.items()}


def table(results: dict[str, dict[str, float]]) -> str:
    header = (
        "| workload | unwatched step | hooks idle | full, every step | defaults, long run "
        "| defaults, first 100 steps |"
    )
    lines = [header, "|---|---|---|---|---|---|"]
    for name, times in results.items():
        base = times["unwatched"]
        idle = times["hooks idle"] / base
        full = times["full, every step"] / base
        long_run = (49 * idle + full) / 50
        first_100 = (88 * idle + 12 * full) / 100
        lines.append(
            f"| {name} | {base * 1e3:.1f} ms | {idle:.3f}x | {full:.2f}x | {long_run:.3f}x "
            f"| {first_100:.3f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="rewrite BENCHMARKS.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    results = {}
    for name in args.workloads:
        results[name] = measure(WORKLOADS[name], args.rounds, args.steps)
        print(f"{name}: done", file=sys.stderr)
    text = table(results)
    print(text)
    if args.write:
        command = f"python benchmarks/overhead.py {' '.join(sys.argv[1:])}".strip()
        machine = (
            f"{platform.machine()}, {torch.get_num_threads()} threads, Python "
            f"{platform.python_version()}, torch {torch.__version__}, layerscope "
            f"{layerscope.__version__}"
        )
        replace_section(
            "Step-time overhead (CPU)",
            f"Machine: {machine}. Command: `{command}`.\n"
            f"Medians over {args.rounds} interleaved rounds of {args.steps} steps; ratios to the "
            "unwatched step of the same run. Workloads: CNN = 5 stride-2 convs, batch 256, "
            "1x28x28; GPT = 4 blocks, d=256, 4 heads, sequence 128, batch 8, tied embedding; "
            "MLP = 6 x Linear(1024), batch 128. AdamW; kinds: activation, grad, weight, "
            "weight_grad with every statistic and the log2 histogram.\n\n"
            f"{text}\n\n"
            "Defaults are derived from the two measured rows: Schedule(every=50, dense=10) "
            "records 1 step in 50 in the long run and 12 of the first 100 steps.",
        )


if __name__ == "__main__":
    main()
