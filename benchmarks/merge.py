"""What ``ranks="merge"`` costs: its collectives per flush, and the training step, on 2 ranks.

    python benchmarks/merge.py            # launches 2 gloo ranks with torchrun; prints figures
    python benchmarks/merge.py --write    # also updates its section of BENCHMARKS.md

Each rank trains an MLP of 30 Linear layers and their ReLUs (60 modules: 240 rows a step
with histograms) under DDP, every step recorded, flushing every 10 steps: watched with
``ranks="each"`` and with ``ranks="merge"``, alternately, twice each. The merge's time per
flush is measured inside the writer thread, around ``RankMerge.merge``; the step time on the
training thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

STEPS = 200
WARMUP = 20


def worker(directory: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import layerscope
    from layerscope.writer import _rank_merge

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(30):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(32, 256, generator=torch.Generator().manual_seed(rank))
    merges: list[float] = []
    original = _rank_merge.RankMerge.merge

    def timed(self, done):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return original(self, done)
        finally:
            merges.append(time.perf_counter() - start)

    _rank_merge.RankMerge.merge = timed  # type: ignore[method-assign]
    results: dict[str, float] = {}
    # Alternated, twice each, the lower median kept: a busy moment of the machine (2 ranks on
    # 2 cores) then costs one configuration no more than the other.
    for index, ranks in enumerate(("each", "merge", "each", "merge")):
        steps = []
        run = f"{directory}/{ranks}-{index}"
        with layerscope.watch(
            model, optimizer=optimizer, every=1, run=run, ranks=ranks, alerts=False
        ):
            for _ in range(STEPS):
                start = time.perf_counter()
                model(data).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                steps.append(time.perf_counter() - start)
        dist.barrier()
        median = statistics.median(steps[WARMUP:])
        results[ranks] = min(results.get(ranks, median), median)
        if ranks == "merge":
            merged_run = run
    rows = layerscope.load(merged_run).sql("select count(*) as n from stats")["n"][0]
    if rank == 0:
        Path(f"{directory}/result.json").write_text(
            json.dumps(
                {
                    "each": results["each"],
                    "merge": results["merge"],
                    "merge_per_flush": statistics.median(merges),
                    "flushes": len(merges),
                    "rows": int(rows),
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc_per_node=2", __file__, "--worker", tmp]
        env = os.environ | {"OMP_NUM_THREADS": "1"}
        subprocess.run(command, check=True, env=env, capture_output=True)
        result = json.loads(Path(tmp, "result.json").read_text())
    lines = [
        "| measure | figure |",
        "|---|---|",
        f"| `RankMerge.merge` per flush of 10 steps (2,400 rows, 256-slot histograms), "
        f"median of {result['flushes']} | {result['merge_per_flush'] * 1e3:.1f} ms |",
        f'| training step, `ranks="each"`, median | {result["each"] * 1e3:.2f} ms |',
        f'| training step, `ranks="merge"`, median | {result["merge"] * 1e3:.2f} ms |',
        f'| rows rank 0 wrote with `ranks="merge"` ({STEPS} steps) | {result["rows"]:,} |',
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from report import command, machine, replace_section

        replace_section(
            "Merging across ranks (CPU, 2 gloo ranks)",
            f"Command: `{command('merge.py')}` on {machine(1)} per rank.\n\n"
            "DDP over an MLP of 30 Linear layers and their ReLUs, every step recorded, a "
            "flush every 10 steps: two packed all-reduces (and one of seven integers) per "
            "flush, on the writer thread.\n\n" + text,
        )


if __name__ == "__main__":
    main()
