"""Time per element of the statistics kernels on the CPU: the C kernel and the torch ones.

    python benchmarks/kernel.py                  # prints the tables
    python benchmarks/kernel.py --write          # also updates BENCHMARKS.md
    python benchmarks/kernel.py --quick          # the C kernel only: no torch.compile
    python benchmarks/kernel.py --clock process  # CPU time of the process, not wall time

Eight tensors of 400,000 values each (12.8 MB of float32, more than L2), read in turn; the
figure is the best of 15 passes over all of them, in nanoseconds per element. The first table
times float32 with the log2 histogram, with it split by sign (what the TensorBoard, W&B and
MLflow sinks ask for) and without a histogram, for each copy of the C kernel this CPU runs and
for the torch kernels; the second the other dtypes and the linear histogram, on 2 threads.
With ``--clock process`` the figure is the CPU time of the process, all its threads: on a
machine that other work shares, less noisy than the wall clock.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from layerscope.stats import (
    HistogramSpec,
    LinearHistogram,
    Log2Histogram,
    SignedLog2Histogram,
    _native,
    _partials,
    _torch_kernels,
)
from layerscope.stats._layout import WIDTH
from report import replace_section

SIZE, COUNT, PASSES = 400_000, 8, 15
LINEAR = LinearHistogram(-4.0, 4.0, 64)
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
clock = CLOCKS["wall"]


def per_element(kernel: Callable[[torch.Tensor], object], tensors: list[torch.Tensor]) -> float:
    for x in tensors:
        kernel(x)  # warm: compile, allocate
    best = float("inf")
    for _ in range(PASSES):
        start = clock()
        for x in tensors:
            kernel(x)
        best = min(best, clock() - start)
    return best / (SIZE * COUNT) * 1e9


def native(histogram: HistogramSpec | None) -> Callable[[torch.Tensor], object]:
    slots = 0 if histogram is None else histogram.slots
    rows = torch.zeros(1, WIDTH + slots, dtype=torch.float64)
    return lambda x: _native.partials_into(x, rows, 0, histogram)


def torch_kernel(histogram: HistogramSpec | None) -> Callable[[torch.Tensor], object]:
    """The torch kernels as the CPU falls back on them: compiled where it can."""
    return lambda x: _partials._torch_partials(x, histogram, quiet=False)


def eager(histogram: HistogramSpec | None) -> Callable[[torch.Tensor], object]:
    def run(x: torch.Tensor) -> object:
        if histogram is None:
            return _torch_kernels.float32_partials(x)
        if histogram.signed:
            row, bins = _torch_kernels.float32_partials_and_signed_bins(x)
        else:
            row, bins = _torch_kernels.float32_partials_and_bins(x)
        return row, _torch_kernels.count_bins(bins, histogram.slots)

    return run


def float32_table(quick: bool) -> list[str]:
    torch.manual_seed(0)
    data = {
        "randn": [torch.randn(SIZE) for _ in range(COUNT)],
        "relu(randn): half zeros": [torch.randn(SIZE).relu() for _ in range(COUNT)],
        # Most values below fp8's and some below fp16's smallest subnormal: the formats'
        # counts run on every block.
        "randn * 1e-5: gradient-like": [torch.randn(SIZE) * 1e-5 for _ in range(COUNT)],
    }
    kernels: list[tuple[str, int, Callable[[HistogramSpec | None], Callable[..., object]]]] = []
    if _native.library() is not None:
        best = _native.select_isa(None)
        kernels += [(f"C kernel ({best}), 1 thread", 1, native)]
        for isa in reversed(_native.ISAS[: _native.ISAS.index(best) + 1]):
            kernels.append((f"C kernel ({isa}), 2 threads", 2, native))
    if not quick:
        kernels += [
            ("torch.compile'd kernel, 2 threads", 2, torch_kernel),
            ("eager torch kernel, 2 threads", 2, eager),
        ]
    lines = [
        "| kernel | data | with histogram | split by sign | without |",
        "|---|---|---|---|---|",
    ]
    histograms = (Log2Histogram(), SignedLog2Histogram(), None)
    for name, threads, make in kernels:
        torch.set_num_threads(threads)
        if name.startswith("C kernel"):
            _native.select_isa(name.split("(")[1].split(")")[0])
        for label, tensors in data.items():
            times = [per_element(make(h), tensors) for h in histograms]
            cells = " | ".join(f"{t:.2f} ns" for t in times)
            lines.append(f"| {name} | {label} | {cells} |")
            print(lines[-1], flush=True)
    if _native.library() is not None:
        _native.select_isa(None)
    return lines


def dtype_table(quick: bool) -> list[str]:
    torch.manual_seed(0)
    base = [torch.randn(SIZE) for _ in range(COUNT)]
    cases: list[tuple[str, list[torch.Tensor], HistogramSpec]] = [
        ("float32, log2 histogram", base, Log2Histogram()),
        ("bfloat16, log2 histogram", [x.bfloat16() for x in base], Log2Histogram()),
        ("float16, log2 histogram", [x.half() for x in base], Log2Histogram()),
    ]
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            fp8 = [x.to(getattr(torch, name)) for x in base]
            cases.append((f"{name}, log2 histogram", fp8, Log2Histogram()))
    cases.append((f"float32, linear histogram of {LINEAR.bins} bins", base, LINEAR))
    torch.set_num_threads(2)
    header = "| input, 2 threads | C kernel |" + ("" if quick else " torch kernels |")
    lines = [header, "|---|---|" + ("" if quick else "---|")]
    for label, tensors, histogram in cases:
        cells = []
        if _native.library() is not None:
            cells.append(f"{per_element(native(histogram), tensors):.2f} ns")
        else:
            cells.append("-")
        if not quick:
            cells.append(f"{per_element(torch_kernel(histogram), tensors):.2f} ns")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--quick", action="store_true", help="the C kernel only")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="what a figure times")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    print(f"kernel: {_partials.kernel_name('cpu')}", flush=True)
    first = float32_table(args.quick)
    print(flush=True)
    second = dtype_table(args.quick)
    torch.set_num_threads(2)
    if args.write:
        command = f"python benchmarks/kernel.py {' '.join(sys.argv[1:])}".strip()
        replace_section(
            "Statistics kernel (CPU)",
            f"Command: `{command}`. Per element, best of {PASSES} passes over {COUNT} tensors "
            f"of {SIZE:,} values ({args.clock} clock): every partial (count, mean, M2, min, max, "
            "zeros, NaN, Inf, signs) with the 256-bin log2 histogram, with it split by sign "
            "(512 slots, counted only where a tracker sink asks for signed histograms) and "
            "without a histogram, for each copy of the C kernel this CPU runs (its best one is "
            "the default) and the torch kernels.\n\n"
            + "\n".join(first)
            + "\n\nOther dtypes and the linear histogram (`histogram=('linear', -4, 4, 64)`), "
            "randn; the torch kernels as the CPU falls back on them (float32 widened, "
            "torch.compile'd, the linear bins eager):\n\n" + "\n".join(second),
        )


if __name__ == "__main__":
    main()
