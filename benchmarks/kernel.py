"""Time per element of the statistics kernels on the CPU: the C kernel and the torch ones.

    python benchmarks/kernel.py            # prints the table
    python benchmarks/kernel.py --write    # also updates BENCHMARKS.md

Eight float32 tensors of 400,000 values each (12.8 MB, more than L2), read in turn; the
figure is the best of 15 passes over all of them, in nanoseconds per element.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from layerscope.stats import WIDTH, Log2Histogram, _native, _partials
from report import replace_section

SIZE, COUNT, PASSES = 400_000, 8, 15


def per_element(kernel: Callable[[torch.Tensor], object], tensors: list[torch.Tensor]) -> float:
    for x in tensors:
        kernel(x)  # warm: compile, allocate
    best = float("inf")
    for _ in range(PASSES):
        start = time.perf_counter()
        for x in tensors:
            kernel(x)
        best = min(best, time.perf_counter() - start)
    return best / (SIZE * COUNT) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = {
        "randn": [torch.randn(SIZE) for _ in range(COUNT)],
        "relu(randn): half zeros": [torch.randn(SIZE).relu() for _ in range(COUNT)],
    }
    rows = torch.zeros(1, WIDTH + Log2Histogram.slots, dtype=torch.float64)
    kernels: dict[str, tuple[int, Callable[[torch.Tensor, bool], object]]] = {}
    if _native.library() is not None:

        def native(x: torch.Tensor, hist: bool) -> None:
            _native.partials_into(x, rows, 0, hist)

        kernels["C kernel, 1 thread"] = (1, native)
        kernels["C kernel, 2 threads"] = (2, native)
    kernels["torch.compile'd kernel, 2 threads"] = (2, _compiled)
    kernels["eager torch kernel, 2 threads"] = (2, _eager)
    lines = [
        "| kernel | data | with histogram | without |",
        "|---|---|---|---|",
    ]
    for name, (threads, kernel) in kernels.items():
        torch.set_num_threads(threads)
        for label, tensors in data.items():
            times = [per_element(lambda x, h=h, k=kernel: k(x, h), tensors) for h in (True, False)]
            lines.append(f"| {name} | {label} | {times[0]:.2f} ns | {times[1]:.2f} ns |")
            print(lines[-1], flush=True)
    torch.set_num_threads(2)
    text = "\n".join(lines)
    if args.write:
        command = f"python benchmarks/kernel.py {' '.join(sys.argv[1:])}".strip()
        replace_section(
            "Statistics kernel (CPU)",
            f"Command: `{command}`. Per element of float32, best of {PASSES} passes over "
            f"{COUNT} tensors of {SIZE:,} values: every partial (count, mean, M2, min, max, "
            "zeros, NaN, Inf, signs) with and without the 256-bin log2 histogram.\n\n" + text,
        )


def _compiled(x: torch.Tensor, hist: bool) -> object:
    out = _partials._fused_float32(x, with_bins=hist)
    if hist:
        row, bins = out
        return row, _partials._count_bins(bins, Log2Histogram.slots)
    return out


def _eager(x: torch.Tensor, hist: bool) -> object:
    if hist:
        row, bins = _partials._float32_partials_and_bins(x)
        return row, _partials._count_bins(bins, Log2Histogram.slots)
    return _partials._float32_partials(x)


if __name__ == "__main__":
    main()
