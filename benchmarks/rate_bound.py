"""What the ``update_ratio`` rate bound costs: reading an adaptive optimizer's rates and norms.

    python benchmarks/rate_bound.py            # prints the table
    python benchmarks/rate_bound.py --write    # also updates its section of BENCHMARKS.md

On recorded steps, before the optimizer's step, the training thread notes each AdamW group's
rate and its parameters' norms (``hooks._rate_bounds``). Per workload of the overhead
benchmark: the median CPU time of that reading over ``--rounds`` calls, against the median
CPU time of an unwatched training step (AdamW at 1e-3), on one thread. The default schedule
records one step in 100 after its first 10: the long run pays a hundredth of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import report  # run as a script
from layerscope.hooks._rate_bounds import rate_bounds
from layerscope.recording import Owner
from workloads import WORKLOADS, Workload

TITLE = "The rate bound of update_ratio"


def costs(workload: Workload, rounds: int) -> tuple[float, float, int]:
    """The median seconds of an unwatched step and of the reading, and the parameter count."""
    torch.manual_seed(0)
    model = workload.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = workload.make_batch(torch.Generator().manual_seed(0))

    def step() -> None:
        workload.loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()

    def timed(run: object) -> float:
        start = time.process_time()
        run()  # type: ignore[operator]
        return time.process_time() - start

    for _ in range(3):
        step()
    steps = statistics.median(timed(step) for _ in range(rounds))
    owned = [(param, [Owner("", "", name)]) for name, param in model.named_parameters()]

    def read() -> None:
        bounds = rate_bounds(optimizer, owned)
        assert bounds is not None
        [float(norm) for norm in bounds.norms]  # what the writer thread reads

    reading = statistics.median(timed(read) for _ in range(rounds))
    return steps, reading, len(owned)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        "| workload | parameters | unwatched step | the reading | of a recorded step | "
        "over the default schedule's long run |",
        "|---|---|---|---|---|---|",
    ]
    for name, workload in WORKLOADS.items():
        step, reading, count = costs(workload, args.rounds)
        lines.append(
            f"| {name} | {count} | {step * 1e3:.2f} ms | {reading * 1e3:.3f} ms | "
            f"{reading / step:.4f} | {reading / step / 100:.6f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.write:
        report.replace_section(
            TITLE,
            f"Machine: {report.machine(1)}. Command: `{report.command('rate_bound.py')}`. "
            "On recorded steps the training thread reads each adaptive optimizer group's rate "
            "and, in one foreach norm, its parameters' norms before the step, for "
            "`update_ratio`'s bound without `update` rows. CPU time (median of 20) of that "
            "reading on the overhead benchmark's workloads (AdamW), against an unwatched step; "
            "the default schedule records one step in 100 after its first 10.\n\n" + text,
        )


if __name__ == "__main__":
    main()
