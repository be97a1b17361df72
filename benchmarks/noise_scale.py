"""What ``watch(noise_scale=)`` costs a step of accumulated micro-batches, recorded or not.

    python benchmarks/noise_scale.py            # prints the table
    python benchmarks/noise_scale.py --write    # also updates its section of BENCHMARKS.md

Each step of a workload of the overhead benchmark is ``--micro`` micro-batches (each loss
divided by their count) and one AdamW step. Per round and workload, in a new order each round:
an unwatched copy, and copies watched with every kind of the defaults, with and without the
noise scale, on recorded steps (``every=1``) and on unrecorded ones (``every=10**6``, after
step 0). Each figure is the median over rounds of the median step in its block; ratios are
taken within a round, to the same watch without the noise scale.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import layerscope
import report  # run as a script
from workloads import WORKLOADS, Workload

CONFIGS = ("unwatched", "recorded", "recorded+noise", "unrecorded", "unrecorded+noise")


def step_seconds(workload: Workload, config: str, micro: int, steps: int) -> float:
    """The median time of ``steps`` training steps of ``micro`` micro-batches under ``config``."""
    torch.manual_seed(0)
    model = workload.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(micro)]
    scope = None
    if config != "unwatched":
        every = 1 if config.startswith("recorded") else 10**6
        noise = config.endswith("+noise")
        scope = layerscope.watch(model, optimizer=optimizer, every=every, noise_scale=noise)
    times = []
    for step in range(steps + 1):  # step 0: warm-up (and the one recorded step of every=10**6)
        start = time.perf_counter()
        for inputs, targets in batches:
            (workload.loss(model(inputs), targets) / micro).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step:
            times.append(time.perf_counter() - start)
    if scope is not None:
        scope.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["cnn", "mlp"], choices=WORKLOADS)
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    rows = []
    for name in args.workloads:
        workload = WORKLOADS[name]
        torch.set_num_threads(workload.threads or args.threads)
        rounds: dict[str, list[float]] = {config: [] for config in CONFIGS}
        for _ in range(args.rounds):
            order = list(CONFIGS)
            random.shuffle(order)
            for config in order:
                rounds[config].append(step_seconds(workload, config, args.micro, args.steps))
        median = {config: statistics.median(times) for config, times in rounds.items()}
        ratio = {
            base: statistics.median(
                with_noise / without
                for with_noise, without in zip(rounds[base + "+noise"], rounds[base], strict=True)
            )
            for base in ("recorded", "unrecorded")
        }
        rows.append(
            f"| {name} | {1e3 * median['unwatched']:.1f} ms | {1e3 * median['recorded']:.1f} ms "
            f"| {1e3 * median['recorded+noise']:.1f} ms | {ratio['recorded']:.2f}x "
            f"| {1e3 * median['unrecorded']:.1f} ms | {1e3 * median['unrecorded+noise']:.1f} ms "
            f"| {ratio['unrecorded']:.2f}x |"
        )
    text = (
        "| workload | unwatched step | recorded step | recorded, noise scale | ratio "
        "| unrecorded step | unrecorded, noise scale | ratio |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
    )
    print(text)
    if args.write:
        report.replace_section(
            "Gradient noise scale (CPU)",
            f"Machine: {report.machine(args.threads)}. Command: "
            f"`{report.command('noise_scale.py')}`. A step is {args.micro} micro-batches of the "
            "overhead benchmark's workload (each loss divided by their count) and one AdamW "
            "step; watched with the default kinds, on recorded steps (`every=1`) and on "
            "unrecorded ones (`every=10**6`), with and without `noise_scale=True`. Medians "
            f"over {args.rounds} interleaved rounds of the median of {args.steps} steps; each "
            "ratio is to the same watch without the noise scale, within a round. Memory: no "
            "copy of the gradients is kept; each parameter holds two 0-d sums during a "
            "recorded step, and a gradient that is not float32 or float64 (or not contiguous) "
            "is flattened into a float32 copy, one parameter at a time, while its hook "
            "runs. An unrecorded step carries no hook of the noise scale: its ratio is the "
            "machine's noise, which was large (other work shared the 2 cores).\n\n" + text,
        )


if __name__ == "__main__":
    main()
