"""What the rules' readings on recorded steps cost: the rate bound and the output's spread.

    python benchmarks/rule_readings.py            # prints the table
    python benchmarks/rule_readings.py --write    # also updates its section of BENCHMARKS.md

On recorded steps the training thread takes two readings for the rules, by default: before
the optimizer's step, each adaptive optimizer group's rate and its parameters' norms (for
``update_ratio``'s bound, ``hooks._rate_bounds``), and as the model's forward returns, how
much its output varies from sample to sample (for ``not_learning``,
``hooks._output_spread``). Per workload of the overhead benchmark: the median CPU time of
each reading over ``--rounds`` calls, against the median CPU time of an unwatched training
step (AdamW at 1e-3), on one thread. The default schedule records one step in 100 after its
first 10: the long run pays a hundredth of them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import report  # run as a script
from layerscope.hooks._output_spread import output_spread
from layerscope.hooks._rate_bounds import rate_bounds
from layerscope.recording import Owner
from workloads import WORKLOADS, Workload

TITLE = "The rules' readings on recorded steps"


def _timed(run: Callable[[], object]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def costs(workload: Workload, rounds: int) -> tuple[float, float, float, int]:
    """The median seconds of an unwatched step, the rate bound and the output's spread, and
    the parameter count."""
    torch.manual_seed(0)
    model = workload.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = workload.make_batch(torch.Generator().manual_seed(0))

    def step() -> None:
        workload.loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    steps = statistics.median(_timed(step) for _ in range(rounds))
    owned = [(param, [Owner("", "", name)]) for name, param in model.named_parameters()]

    def bound() -> None:
        bounds = rate_bounds(optimizer, owned)
        assert bounds is not None
        [float(norm) for norm in bounds.norms]  # what the writer thread reads

    with torch.no_grad():
        output = model(inputs)

    def spread() -> None:
        found = output_spread(output)
        assert found is not None
        float(found[0])  # what the writer thread reads

    bounding = statistics.median(_timed(bound) for _ in range(rounds))
    spreading = statistics.median(_timed(spread) for _ in range(rounds))
    return steps, bounding, spreading, len(owned)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        "| workload | parameters | unwatched step | the rate bound | the output's spread | "
        "both, against the step | over the default schedule's long run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, workload in WORKLOADS.items():
        step, bound, spread, count = costs(workload, args.rounds)
        both = (bound + spread) / step
        lines.append(
            f"| {name} | {count} | {step * 1e3:.2f} ms | {bound * 1e3:.3f} ms | "
            f"{spread * 1e3:.3f} ms | {both:.4f} | {both / 100:.6f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.write:
        report.replace_section(
            TITLE,
            f"Machine: {report.machine(1)}. Command: `{report.command('rule_readings.py')}`. "
            "On recorded steps the training thread reads each adaptive optimizer group's rate "
            "and, in one foreach norm, its parameters' norms before the step, for "
            "`update_ratio`'s bound without `update` rows; and, as the model's forward "
            "returns, the spread of its output over at most 1,024 rows (`output_spread`, for "
            "`not_learning`). CPU time (median of 20) of each reading on the overhead "
            "benchmark's workloads (AdamW), against an unwatched step; the default schedule "
            "records one step in 100 after its first 10.\n\n" + text,
        )


if __name__ == "__main__":
    main()
