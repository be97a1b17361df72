"""The GPU kernels compiled for the H100 and H200 (sm_90) ahead of time, with no GPU at hand.

Triton's interpreter runs the kernels' arithmetic but not Triton's compiler: how the JIT
specialises arguments (a size of 1 becomes a constant), what compiles and what a variant
costs in registers are the compiler's. ``benchmarks/gpu_kernels.py`` makes every launch the
GPU path makes through Triton's own JIT against a driver that names sm_90 and launches
nothing, and reads each compiled variant's cubin and PTX; here it runs once, in two processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")

from layerscope.stats import _triton  # noqa: E402

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_kernels.py"
DEFAULT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
# One dtype of each way the kernels read one (float16 loads as float32 does, and the integers
# as int64 do, but for their width), with the log2 and the linear histogram: the benchmark's
# own run compiles all 12 dtypes and the floats without a histogram too.
DTYPES = ("float32", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "bool", "int64")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script's record, compiled in two processes at once (half the dtypes each)."""
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "ptxas").exists() or not (tools / "cuobjdump").exists():
        pytest.skip("this triton wheel carries no ptxas and cuobjdump")
    folder = tmp_path_factory.mktemp("kernels")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(folder / "cache")  # compiled here, not found in a cache
    shards = [folder / f"shard{k}.json" for k in range(2)]
    command = [sys.executable, str(SCRIPT), "--arch", "90", "--dtypes", ",".join(DTYPES)]
    command += ["--histograms", "log2,linear"]  # integers take none; floats' none is log2's less
    processes = [
        subprocess.Popen(
            [*command, "--shard", f"{k}/2", "--json", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for k, out in enumerate(shards)
    ]
    printed = [process.communicate(timeout=600)[0] for process in processes]
    records = []
    for out, text in zip(shards, printed, strict=True):
        if not out.exists():
            pytest.fail(f"gpu_kernels.py wrote nothing:\n{text[-3000:]}")
        records.append(json.loads(out.read_text()))
    variants: dict[str, dict[str, Any]] = {}
    for variant in (v for record in records for v in record["variants"]):
        seen = variants.setdefault(variant["hash"], variant)
        if seen is not variant:  # compiled in both: the launches of both
            whats = set(seen["what"].split("; ")) | set(variant["what"].split("; "))
            seen["what"] = "; ".join(sorted(whats))
    merged = records[0] | {
        "variants": list(variants.values()),
        "failures": [failure for record in records for failure in record["failures"]],
    }
    return merged


def test_every_launch_compiles_tensors_of_one_element_included(compiled):
    # A size of 1 is a constant to Triton's JIT unless the kernel says otherwise; the
    # interpreter never shows it.
    assert compiled["failures"] == []
    whats = {what for v in compiled["variants"] for what in v["what"].split("; ")}
    for dtype in DTYPES:
        histogram = "none" if dtype in ("bool", "int64") else "log2"
        assert f"{dtype}, {histogram}, one element" in whats
        assert f"{dtype} group, {histogram}" in whats
    kernels = {v["kernel"] for v in compiled["variants"]}
    assert kernels == {"partials_kernel", "finish_kernel", "extremes_kernel",
                       "extremes_finish_kernel"}  # fmt: skip


def test_no_variant_spills_or_fuses_or_adds_atomically_to_global_memory(compiled):
    for v in compiled["variants"]:
        assert not v["spills"], v
        # Fused multiply-adds round once where the CPU kernels round twice: a value on a
        # linear bin's edge would change bins between devices.
        assert v["fused_multiply_adds"] == 0, v
        assert v["global_atomics"] == 0, v  # each program's histogram is its own


def _default_histogram_of_a_narrow_float(what: str) -> bool:
    """``what`` ("bfloat16 group, log2", "float32, log2, unaligned"): the defaults' reading."""
    dtype, *rest = what.split(", ")
    return dtype.removesuffix(" group") in DEFAULT_DTYPES and rest[:1] in (["log2"], ["none"])


def test_a_tensors_programs_fit_on_the_multiprocessors_at_once(compiled):
    # The grid of one tensor is PROGRAMS_PER_SM programs per multiprocessor at most: the
    # default histogram's variants hold that many at once, so one wave reads the tensor.
    assert compiled["programs_per_sm"] == _triton.PROGRAMS_PER_SM
    checked = 0
    for v in compiled["variants"]:
        whats = v["what"].split("; ")
        if v["kernel"] != "partials_kernel" or all(
            map(_default_histogram_of_a_narrow_float, whats)
        ):
            assert v["resident_per_processor"] >= _triton.PROGRAMS_PER_SM, v
            checked += 1
    assert checked >= 25
