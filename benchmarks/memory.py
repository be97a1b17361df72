"""Peak memory of a watched run against an unwatched one, and growth over steps.

    python benchmarks/memory.py            # prints the table
    python benchmarks/memory.py --write    # also updates the memory section of BENCHMARKS.md

Each configuration trains in a fresh process (peak RSS is per process); the figures are the
peak resident set while training, the peak at the end (after ``close``, which compacts the
run's segments into one file per table), and how much the resident set grew from half-way to
the end of training.
On the CPU the statistics come from layerscope's C kernel; one configuration uses the compiled
torch kernel instead (LAYERSCOPE_NATIVE=0), whose compiler is a one-off cost of its own. Another
trains unwatched after writing one small Parquet file: the fixed cost of writing Parquet at
all (pyarrow, its writer, lz4, Arrow's thread pools). Writing does not load pandas. Watched
runs write to a run directory, as a long run would; an in-memory run (``run=None``) keeps
every row, by design. One configuration records and drops the rows (a ``NullSink`` where the
in-memory run's sink would be): the cost of recording, without a store.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from report import replace_section

STEPS = {"cnn": 400, "gpt": 40, "mlp": 120}
# name: (watch options or None, environment, import the store's libraries first, keep rows)
CONFIGS: dict[str, tuple[str | None, dict[str, str], bool, bool]] = {
    "unwatched": (None, {}, False, True),
    "unwatched, after writing one small Parquet file": (None, {}, True, True),
    "defaults": ("dict()", {}, False, True),
    "full, every step": ("dict(every=1)", {}, False, True),
    "full, every step, rows discarded (no store)": ("dict(every=1)", {}, False, False),
    "full, every step, compiled torch kernel": (
        "dict(every=1)",
        {"LAYERSCOPE_NATIVE": "0"},
        False,
        True,
    ),
}

CHILD = """
import json, resource, sys, tempfile, torch
sys.path.insert(0, {benchmarks!r})
torch.set_num_threads(2)
import layerscope
from workloads import WORKLOADS
if {preload}:  # the store's fixed cost: pyarrow, its Parquet writer, lz4, thread pools
    import io, numpy, pyarrow, pyarrow.parquet
    from layerscope.store._arrays import numeric
    table = pyarrow.table({{"x": numeric(numpy.arange(100), pyarrow.int64())}})
    pyarrow.parquet.write_table(table, io.BytesIO(), compression="lz4")

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

workload = WORKLOADS[{workload!r}]
torch.manual_seed(0)
model = workload.make_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
options = {options}
run = tempfile.mkdtemp() + "/run"  # to disk, as a long run would: memory holds no rows
if not {keep}:  # recording alone: the rows go nowhere, and no store is loaded
    import layerscope.scope._scope
    from layerscope.sinks import NullSink
    layerscope.scope._scope.MemorySink = NullSink
    run = None
scope = None
if options is not None:
    scope = layerscope.watch(model, optimizer=optimizer, run=run, **options)
generator = torch.Generator().manual_seed(0)
steps, early = {steps}, None
for step in range(steps):
    x, y = workload.make_batch(generator)
    workload.loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == steps // 2:  # after warm-up: allocator pools, first flushes, compaction
        early = rss_mb()
end = rss_mb()  # before close, whose compaction reads the run back
training = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if scope is not None:
    scope.close()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(dict(peak=peak, training=training, early=early, end=end)))
"""


def run(workload: str, config: str) -> dict[str, float]:
    options, extra, preload, keep = CONFIGS[config]
    code = CHILD.format(
        benchmarks=str(Path(__file__).parent),
        workload=workload,
        options=options,
        steps=STEPS[workload],
        preload=preload,
        keep=keep,
    )
    environment = {**os.environ, **extra}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(STEPS))
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    lines = [
        "| workload | configuration | peak RSS while training | vs unwatched "
        "| peak RSS with close | vs unwatched | growth, half-way to end |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload in args.workloads:
        base: dict[str, float] = {}
        for config in CONFIGS:
            result = run(workload, config)
            base = base or result
            cells = [
                f"{result[peak]:.0f} MB | {result[peak] - base[peak]:+.0f} MB "
                f"({result[peak] / base[peak]:.2f}x)"
                for peak in ("training", "peak")
            ]
            lines.append(
                f"| {workload} ({STEPS[workload]} steps) | {config} | {cells[0]} | {cells[1]} "
                f"| {result['end'] - result['early']:+.1f} MB |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    if args.write:
        command = f"python benchmarks/memory.py {' '.join(sys.argv[1:])}".strip()
        replace_section("Memory (CPU)", f"Command: `{command}`.\n\n{text}")


if __name__ == "__main__":
    main()
