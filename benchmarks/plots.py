"""Time and peak memory of each figure and animation of a large run.

    python benchmarks/plots.py            # 200 layers x 5,000 recorded steps; prints the figures
    python benchmarks/plots.py --write    # also updates the plots section of BENCHMARKS.md

The run (``synthetic.write_run``: 4 kinds, log2 histograms, 4,000,000 rows) is written once
into a temporary folder. Each figure is made from a freshly loaded run, as a script would: the
time covers the queries, the drawing and ``savefig`` to PNG; the peak is the process's resident
memory above what it held before (Linux's VmHWM, reset before each figure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

sys.path.insert(0, str(Path(__file__).parent))

import layerscope
from report import command, machine, replace_section
from synthetic import write_run

matplotlib.use("Agg")

FIGURES: dict[str, Callable[[Any], Any]] = {
    "stats(kind='activation')": lambda plot: plot.stats(kind="activation"),
    "color_dim(kind='activation')": lambda plot: plot.color_dim(kind="activation"),
    "dead_chart()": lambda plot: plot.dead_chart(),
    "heatmap('absmax', 'grad')": lambda plot: plot.heatmap(stat="absmax", kind="grad"),
    "grad_norms()": lambda plot: plot.grad_norms(),
    "histogram('layers.100')": lambda plot: plot.histogram("layers.100"),
    "scalars()": lambda plot: plot.scalars(),
}


ANIMATIONS = ("gif", "mp4")


def peak_resident_mib() -> float:
    """The most resident memory this process has held, in MiB (Linux's VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def one(path: Path, name: str, animation_steps: int) -> dict[str, float]:
    """Make one figure (or animation) of the run at ``path``; its time and peak memory.

    Runs in a process of its own, so the peak is this figure's: after the imports, the rest
    is what loading the run and drawing took.
    """
    # What any figure imports (matplotlib, pandas, pyarrow, DuckDB) is loaded before the
    # baseline: the peak is the figure's data and drawing.
    import duckdb
    import matplotlib.animation
    import pandas
    import pyarrow.parquet

    del matplotlib, pandas, pyarrow
    duckdb.connect().close()
    baseline = peak_resident_mib()
    start = time.perf_counter()
    if name in ANIMATIONS:
        target = path.parent / f"animation.{name}"
        steps = list(range(animation_steps))
        layerscope.animate(path, "layers.100", "activation", path=target, steps=steps)
    else:
        fig = FIGURES[name](layerscope.load(path).plot)
        fig.savefig(path.parent / "figure.png", dpi=100)
    return {"seconds": time.perf_counter() - start, "peak_mib": peak_resident_mib() - baseline}


def measure(path: Path, name: str, animation_steps: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--one", name, "--run", str(path),
         "--animation-steps", str(animation_steps)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--animation-steps", type=int, default=500)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a figure, in a process of its own
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.run, args.one, args.animation_steps)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_run(Path(tmp) / "big", layers=args.layers, steps=args.steps)
        for name in [*FIGURES, *ANIMATIONS]:
            result = measure(path, name, args.animation_steps)
            label = (
                f"`layerscope.animate(run, module, path='x.{name}')`, {args.animation_steps} frames"
                if name in ANIMATIONS
                else f"`run.plot.{name}`"
            )
            rows.append((label, result["seconds"], result["peak_mib"]))
            print(f"{label}: {result['seconds']:.2f} s, {result['peak_mib']:.0f} MiB", flush=True)
    lines = [
        f"A run of {args.layers} layers by {args.steps:,} recorded steps, 4 kinds with "
        f"log2 histograms ({args.layers * args.steps * 4:,} rows). Each figure in a process of "
        "its own: load the run, draw, write the PNG at 100 dpi (an animation: its file); the "
        "peak is the resident memory it added to a process that had imported matplotlib, "
        "pandas, pyarrow and DuckDB.",
        "",
        "| figure | time | peak memory |",
        "|---|---|---|",
        *(f"| {label} | {seconds:.2f} s | {peak:.0f} MiB |" for label, seconds, peak in rows),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        replace_section(
            "Figures of a large run (CPU)",
            f"Command: `{command('plots.py')}` on {machine(2)}.\n\n{text}",
        )


if __name__ == "__main__":
    main()
