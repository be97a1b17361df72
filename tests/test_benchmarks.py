"""The benchmark scripts still import against the package they measure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def test_every_benchmark_script_imports():
    names = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
    assert {"overhead", "memory", "store", "kernel", "compile"} <= set(names)
    code = f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r})\n" + "".join(
        f"import {name}\n" for name in names
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def _benchmark(name):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_synthetic_run_reads_back_as_a_run(tmp_path):
    import layerscope

    path = _benchmark("synthetic").write_run(tmp_path / "big", layers=3, steps=40)
    run = layerscope.load(path)
    assert run.meta["status"] == "finished"
    assert [info.name for info in run.modules] == ["", "layers.0", "layers.1", "layers.2"]
    counts = run.sql("select kind, count(*) as n, count(distinct step) as s from stats group by 1")
    assert dict(zip(counts["kind"], counts["n"], strict=True)) == dict.fromkeys(
        ("activation", "grad", "weight", "weight_grad"), 120
    )
    assert set(counts["s"]) == {40}
    stats = run.stats
    # Histograms hold every element, and the finalised statistics are consistent.
    assert (stats["hist"].map(sum) == stats["numel"]).all()
    assert ((stats["min"] <= stats["mean"]) & (stats["mean"] <= stats["max"])).all()
    assert len(run.scalars) == 80


def test_store_benchmark_writes_what_it_counts(tmp_path):
    import layerscope

    rate = _benchmark("store").write_rate(tmp_path, rows=4800, chunk_rows=2400, flush_every=1)
    assert rate > 0
    assert len(layerscope.load(tmp_path / "write").sql("select step from stats")) == 4800


def test_damage_benchmark_tables_what_it_classified(tmp_path):
    damage = _benchmark("damage")
    case = damage.corpus.BY_NAME["control-untouched"]
    bases = damage.corpus.make_bases(tmp_path / "bases")
    outcomes = damage.classify.Classifier(bases, tmp_path).outcomes(case)
    text = damage.table({case.name: outcomes}, "here", 1.0)
    assert "| control-untouched | ok | ok | ok |" in text
    assert "| ok | 7 | 2 | 9 | 18 |" in text


def test_gpu_benchmark_runs_every_configuration_on_the_cpu(tmp_path):
    import json
    import math

    path = tmp_path / "gpu.json"
    command = [sys.executable, str(BENCHMARKS / "gpu.py"), "--small", "--device", "cpu"]
    command += ["--rounds", "1", "--steps", "2", "--workloads", "stack", "--json", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("Device: CPU")
    stack = json.loads(path.read_text())["workloads"]["stack"]
    gpu = _benchmark("gpu")
    # Every configuration was timed; only a peer that is not installed may be left out.
    missing = set(gpu.CONFIGS) - set(stack["configs"])
    assert missing <= {gpu.TENSORBOARD}
    assert all(any(name in note for note in stack["skipped"]) for name in missing)
    ratios = [figures["ratio"] for figures in stack["configs"].values()]
    ratios += [stack["noise_floor"], *stack["derived"].values()]
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in ratios), ratios
    assert stack["rounds"] == 1
    assert stack["watched"] == 31  # the 10 blocks' 30 leaves and the head
    # The recorded statistics match float64, and the whole tensors kept are the tensors.
    exactness = stack["exactness"]
    assert exactness["worst_relative_error"] < 1e-6
    assert exactness["activations_compared"] == 31
    assert exactness["weights_compared"] == 42  # weight and bias of 21 Linear and LayerNorm
    assert exactness["rows_without_reference"] == 0
    tensors = exactness["tensors"]
    assert tensors["bit_equal"] == tensors["kept"] == tensors["expected"] > 0


def test_attention_benchmark_times_every_configuration(tmp_path):
    import json
    import math

    path = tmp_path / "attention.json"
    command = [sys.executable, str(BENCHMARKS / "attention.py"), "--small", "--rounds", "1"]
    command += ["--steps", "2", "--workloads", "nanogpt", "encoder", "--lengths", "256"]
    command += ["--json", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(path.read_text())
    sizes = figures["sizes"]
    for name in ("nanogpt", "encoder"):
        workload = figures["workloads"][name]
        # The script checks that rows came from recorded steps with attention only.
        assert workload["attention_rows_per_step"] == sizes["layers"] * sizes["heads"]
        ratios = [value for key, value in workload.items() if "_vs_" in key]
        assert len(ratios) == 5
        assert all(math.isfinite(ratio) and ratio > 0 for ratio in ratios), ratios
    (memory,) = figures["memory"]
    assert memory["keys"] == 256
    assert memory["queries_per_chunk"] == 256  # 8 heads x 256 x 256 fit one chunk
    assert memory["chunked"]["peak_mib"] > 0


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux's VmHWM")
def test_attention_recompute_peak_is_its_chunk(tmp_path):
    import json
    import os

    # One chunk of 512 queries x 2,048 keys x 4 heads: 2**22 logits, 32 MiB of float32 logits
    # and exponentials, the bound the kernel's notes give. glibc's mmap threshold fixed: every
    # large block is mapped when allocated and unmapped when freed, so the resident peak is
    # the tensors' (the default threshold keeps freed chunks in the heap).
    command = [sys.executable, str(BENCHMARKS / "attention.py"), "--child", "2048", str(2**22)]
    command += ["--threads", "1"]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = json.loads(done.stdout)["peak_mib"]
    assert peak > 16  # the logits alone: the measure sees the chunk
    assert peak < 32 + 6  # the bound, and a few MiB of queries, masks and rows
