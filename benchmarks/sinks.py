"""What each tracker sink costs the writer thread per flush.

    python benchmarks/sinks.py            # prints the figures
    python benchmarks/sinks.py --write    # also updates its section of BENCHMARKS.md

An MLP of 24 Linear layers and their ReLUs is trained 30 steps, every step recorded into a
MemorySink; its flushes are then replayed through each sink (``write`` and ``flush``) and
timed: TensorBoard's event file, W&B offline, MLflow's local file store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

import layerscope
from layerscope.sinks import MemorySink, MLflow, Records, RunSummary, TensorBoard, WandB
from report import command, machine, replace_section

LAYERS = 24
STEPS = 30


def recorded() -> MemorySink:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(64, 64), nn.ReLU())])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    memory = MemorySink()
    with layerscope.watch(
        model, optimizer=optimizer, every=1, sinks=[memory], alerts=False
    ) as scope:
        for _ in range(STEPS):
            model(torch.randn(32, 64)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=1.0)
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    torch.set_num_threads(2)
    out = tempfile.mkdtemp()
    os.environ.update(
        WANDB_MODE="offline", WANDB_DIR=out, WANDB_SILENT="true", WANDB_CONSOLE="off",
        MLFLOW_ALLOW_FILE_STORE="true",
    )  # fmt: skip
    memory = recorded()
    assert memory.info is not None
    flushes = [Records(stats=chunk) for chunk in memory.chunks]
    rows = [len(records.stats) for records in flushes if records.stats is not None]
    summary = RunSummary("finished", time.time(), STEPS, sum(rows), 0, 0)
    lines = [
        f"{len(flushes)} flushes of {statistics.median(rows):,.0f} rows (median; {LAYERS * 2} "
        "modules, 10 steps a flush, histograms kept).",
        "",
        "| sink | per flush, median | slowest flush | per row |",
        "|---|---|---|---|",
    ]
    sinks = [
        TensorBoard(f"{out}/tb"),
        WandB(project="cost"),
        MLflow(tracking_uri=f"file://{out}/mlruns"),
    ]
    for sink in sinks:
        sink.start(memory.info)
        times = []
        for records in flushes:
            start = time.perf_counter()
            sink.write(records)
            sink.flush()
            times.append(time.perf_counter() - start)
        sink.close(summary)
        per_row = sum(times) / sum(rows) * 1e6
        lines.append(
            f"| {type(sink).__name__} | {statistics.median(times) * 1e3:,.0f} ms "
            f"| {max(times) * 1e3:,.0f} ms | {per_row:,.0f} us |"
        )
    text = "\n".join(lines)
    print(text)
    if args.write:
        replace_section(
            "Tracker sinks (CPU)", f"Command: `{command('sinks.py')}` on {machine(2)}.\n\n{text}"
        )


if __name__ == "__main__":
    main()
