"""The GPU kernels compiled for a GPU ahead of time, on any machine: what each variant costs.

Triton compiles for a target it is told, with the ptxas its wheel carries, with no GPU at hand.
Here the GPU path's own launch code (``stats/_triton.py``) makes each launch it makes on a GPU:
every dtype it reads, each histogram, one tensor and a group, sizes of 1 to a million elements.
Each launch goes through Triton's JIT, which picks the compiled variant from the arguments as it
does on a GPU (constants, alignment), against a driver that names the target and launches
nothing. Of each variant compiled, the cubin gives registers, spills (local memory and stack)
and shared memory (``cuobjdump``), the PTX its fused multiply-adds and global atomics, and the
occupancy arithmetic of the target's limits the programs one multiprocessor holds at once.

    python benchmarks/gpu_kernels.py                    # sm_90: the H100 and H200
    python benchmarks/gpu_kernels.py --arch 80 --json kernels.json
    python benchmarks/gpu_kernels.py --write            # BENCHMARKS.md's section

It refuses to run under ``TRITON_INTERPRET=1``, where kernels are interpreted, not compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
if importlib.util.find_spec("layerscope") is None:  # a checkout, not installed
    sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
import report
from layerscope.stats import LinearHistogram, Log2Histogram, _triton
from layerscope.stats._layout import WIDTH

KERNELS = ("partials_kernel", "finish_kernel", "extremes_kernel", "extremes_finish_kernel")
FLOATS = (
    torch.float32, torch.bfloat16, torch.float16, torch.float64,
    torch.float8_e4m3fn, torch.float8_e5m2,
)  # fmt: skip
INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
HISTOGRAMS = {"log2": Log2Histogram(), "linear": LinearHistogram(-4.0, 4.0, 64), "none": None}
SIZES = (1, 1024, 4099, 1_000_000)  # one element, one block, odd, many blocks
# Multiprocessors of the GPU the grid is sized for (an H100 SXM's; the H200 has as many).
PROCESSORS = 132


@dataclass(frozen=True)
class Limits:
    """A compute capability's per-multiprocessor limits, from CUDA's occupancy tables."""

    registers: int = 65536
    warps: int = 64
    blocks: int = 32
    shared: int = 228 * 1024  # bytes a multiprocessor shares out
    reserved: int = 1024  # shared bytes the system keeps per block


LIMITS = {90: Limits(), 80: Limits(shared=164 * 1024)}


@dataclass
class Variant:
    """One compiled variant of a kernel, and what the launches that use it read."""

    kernel: str
    hash: str  # Triton's: the same in every process that compiles this variant
    what: str
    registers: int
    local_bytes: int
    stack_bytes: int
    shared_bytes: int
    warps: int
    fused_multiply_adds: int
    global_atomics: int
    resident_per_processor: int

    @property
    def spills(self) -> bool:
        return self.local_bytes > 0 or self.stack_bytes > 0


class _CompileOnlyDriver:
    """What Triton's JIT asks of a driver to compile for ``target``: no device, no launch."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


class _Compiling:
    """Stands in for a kernel: compiles the variant a launch would run, and notes it under
    the launch that ``now[0]`` names."""

    def __init__(
        self, name: str, kernel: Any, seen: dict[str, tuple[str, Any, set[str]]], now: list[str]
    ) -> None:
        self.name, self.kernel, self.seen, self.now = name, kernel, seen, now

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def compile_only(*args: Any, **kwargs: Any) -> None:
            compiled = self.kernel.warmup(*args, grid=grid, **kwargs)
            self.seen.setdefault(compiled.hash, (self.name, compiled, set()))[2].add(self.now[0])

        return compile_only


def _launches(
    dtypes: tuple[torch.dtype, ...], histograms: tuple[str, ...], shard: int = 0, shards: int = 1
) -> Iterator[tuple[str, Callable[[], None]]]:
    """Every launch the GPU path makes of ``dtypes``: what it reads, and the call that launches it.

    ``shard`` of ``shards``: the launches of every ``shards``-th dtype from the ``shard``-th.
    """
    generator = torch.Generator().manual_seed(0)

    def tensors() -> list[torch.Tensor]:
        return [torch.randn(size, generator=generator).to(dtype) for size in SIZES]

    for dtype in dtypes[shard::shards]:
        short = str(dtype).removeprefix("torch.")
        chosen = {k: v for k, v in HISTOGRAMS.items() if k in histograms}
        for label, histogram in (chosen if dtype.is_floating_point else {"none": None}).items():
            slots = 0 if histogram is None else histogram.slots
            rows = torch.empty(len(SIZES), WIDTH + slots, dtype=torch.float64)
            for index, x in enumerate(tensors()):
                what = f"{short}, {label}{_size_class(x.numel())}"
                yield what, partial(_triton.partials_into, x, histogram, rows, index)
            if label == "log2":  # a view that starts off its allocation's alignment
                unaligned = tensors()[-1][1:]
                yield (
                    f"{short}, {label}, unaligned",
                    partial(_triton.partials_into, unaligned, histogram, rows, 0),
                )
            group = partial(_triton.group_partials_into, tensors(), histogram, rows, 0)
            yield f"{short} group, {label}", group
        if dtype.is_floating_point:
            pairs = torch.empty(len(SIZES), 2, dtype=torch.float64)
            yield f"{short} group", partial(_triton.group_extremes_into, tensors(), pairs)


def _size_class(numel: int) -> str:
    """How Triton's JIT tells sizes apart: 1 (a constant), a multiple of 16, or another."""
    return ", one element" if numel == 1 else ("" if numel % 16 == 0 else ", odd size")


def compile_all(
    arch: int,
    dtypes: tuple[torch.dtype, ...] = FLOATS + INTEGERS,
    histograms: tuple[str, ...] = tuple(HISTOGRAMS),
    shard: int = 0,
    shards: int = 1,
) -> tuple[list[Variant], list[str]]:
    """Every variant the launches compile for ``sm_{arch}``, and any launch that failed."""
    import triton

    from layerscope.stats import _triton_kernels

    seen: dict[str, tuple[str, Any, set[str]]] = {}
    now = [""]  # the launch being made
    compiling = {
        name: _Compiling(name, getattr(_triton_kernels, name), seen, now) for name in KERNELS
    }
    failures: list[str] = []
    sizes, on_cpu = _triton._sizes, _triton._state["on_cpu"]
    triton.runtime.driver.set_active(_CompileOnlyDriver(arch))
    for name, stand_in in compiling.items():
        setattr(_triton_kernels, name, stand_in)
    _triton._state["on_cpu"] = True  # CPU tensors stand for the GPU's: only their layout is read
    _triton._sizes = lambda device: (_triton.BLOCK, _triton.PROGRAMS_PER_SM * PROCESSORS)  # type: ignore[assignment]
    try:
        for what, launch in _launches(dtypes, histograms, shard, shards):
            now[0] = what
            try:
                launch()
            except Exception as error:  # a variant that does not compile: say which
                lines = str(error).strip().splitlines() or [""]
                failures.append(f"{what}: {type(error).__name__}: {lines[-1]}")
    finally:
        for name, stand_in in compiling.items():
            setattr(_triton_kernels, name, stand_in.kernel)
        _triton._sizes = sizes  # type: ignore[method-assign]
        _triton._state["on_cpu"] = on_cpu
        with contextlib.suppress(RuntimeError):  # no GPU here: no driver to go back to
            triton.runtime.driver.reset_active()
    variants = [_variant(name, compiled, whats, arch) for name, compiled, whats in seen.values()]
    return sorted(variants, key=lambda v: (KERNELS.index(v.kernel), v.what)), failures


def _variant(name: str, compiled: Any, whats: set[str], arch: int) -> Variant:
    usage = _resource_usage(compiled.asm["cubin"])
    ptx = compiled.asm["ptx"]
    warps = compiled.metadata.num_warps
    shared = max(usage["SHARED"], compiled.metadata.shared)
    return Variant(
        kernel=name,
        hash=compiled.hash,
        what="; ".join(sorted(whats)),
        registers=usage["REG"],
        local_bytes=usage["LOCAL"],
        stack_bytes=usage["STACK"],
        shared_bytes=shared,
        warps=warps,
        fused_multiply_adds=len(re.findall(r"\bfma\.", ptx)),
        global_atomics=len(re.findall(r"\b(?:atom|red)\.(?![\w.]*shared)", ptx)),
        resident_per_processor=resident(usage["REG"], warps, shared, LIMITS[arch]),
    )


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """REG, STACK, SHARED and LOCAL of the cubin's one kernel, as cuobjdump prints them."""
    import triton

    tool = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        printed = subprocess.run(
            [tool, "--dump-resource-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    line = next(line for line in printed.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def resident(registers: int, warps: int, shared: int, limits: Limits) -> int:
    """Blocks of a kernel that one multiprocessor holds at once (CUDA's occupancy arithmetic).

    Registers are given out per warp in units of 256 (a thread's count rounded up to 8).
    """
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = (limits.registers // per_warp) // warps
    by_shared = limits.shared // (shared + limits.reserved)
    return min(by_registers, by_shared, limits.warps // warps, limits.blocks)


def _summary(what: str) -> str:
    """The launches of a variant, short where many dtypes share it: what they have in common."""
    whats = what.split("; ")
    if len(whats) <= 3:
        return what
    common = sorted({_without_dtype(w) for w in whats})
    return f"{len(whats)} launches, any dtype: {'; '.join(common)}"


def _without_dtype(what: str) -> str:
    """``"bfloat16 group, log2"``: ``"group, log2"``."""
    dtype, *rest = what.split(", ")
    return ", ".join((["group"] if dtype.endswith(" group") else []) + rest) or "extremes"


def table(variants: list[Variant]) -> str:
    """One line per kernel and what it reads; variants alike but for their arguments'
    alignment (which Triton compiles apart) share a line."""
    lines = [
        "| kernel | launches that compile it | registers | spills | shared | warps | "
        "resident per SM | FMA | global atomics |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for v in variants:
        line = (
            f"| `{v.kernel}` | {_summary(v.what)} | {v.registers} | "
            f"{'yes' if v.spills else 'none'} | {v.shared_bytes} B | {v.warps} | "
            f"{v.resident_per_processor} | {v.fused_multiply_adds} | {v.global_atomics} |"
        )
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, choices=sorted(LIMITS))
    parser.add_argument("--json", type=Path, help="write the variants here as JSON")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument(
        "--dtypes", help="comma-separated, such as float32,bfloat16 (default: all 12 it reads)"
    )
    parser.add_argument(
        "--histograms", default="log2,linear,none", help="of log2, linear (64 bins) and none"
    )
    parser.add_argument(
        "--shard", default="0/1", help="K/N: compile the launches of every N-th dtype from the K-th"
    )
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("gpu_kernels.py compiles the kernels: run it without TRITON_INTERPRET=1")
    import triton

    start = time.perf_counter()
    shard, shards = (int(part) for part in args.shard.split("/"))
    if args.write and shards > 1:
        parser.error("--write needs every launch: leave --shard out")
    dtypes = FLOATS + INTEGERS
    if args.dtypes:
        dtypes = tuple(getattr(torch, name) for name in args.dtypes.split(","))
    histograms = tuple(args.histograms.split(","))
    if args.write and (dtypes != FLOATS + INTEGERS or set(histograms) != set(HISTOGRAMS)):
        parser.error("--write needs every launch: leave --dtypes and --histograms out")
    variants, failures = compile_all(args.arch, dtypes, histograms, shard, shards)
    seconds = time.perf_counter() - start
    if args.json:
        record = {
            "arch": args.arch,
            "triton": triton.__version__,
            "programs_per_sm": _triton.PROGRAMS_PER_SM,
            "variants": [asdict(v) | {"spills": v.spills} for v in variants],
            "failures": failures,
        }
        args.json.write_text(json.dumps(record, indent=1))
    text = table(variants)
    print(text)
    print(f"{len(variants)} variants compiled for sm_{args.arch} in {seconds:.0f} s")
    for failure in failures:
        print("FAILED:", failure)
    if args.write:
        body = (
            f"Triton {triton.__version__}, compiled for sm_{args.arch} on a machine without a "
            f"GPU (`{report.command('gpu_kernels.py')}`): every variant that the GPU path's "
            "launches compile, for float32, bf16, fp16, float64, fp8 and integer tensors, the "
            "log2, a linear (64 bins) and no histogram, one tensor and a group. `resident per SM` "
            "is the programs one multiprocessor holds at once by the occupancy arithmetic of its "
            f"registers, warps and shared memory; a tensor takes at most "
            f"{_triton.PROGRAMS_PER_SM} per multiprocessor, so one wave reads it. FMA: fused "
            "multiply-adds in the PTX (none: each operation rounds as on the CPU).\n\n" + text
        )
        report.replace_section(f"The GPU kernels compiled for sm_{args.arch} (on the CPU)", body)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
