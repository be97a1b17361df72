"""The scale benchmark's runs read back as a torchrun job's, and its bounds stop a reader."""

from __future__ import annotations

import sys

from tests.test_benchmarks import _benchmark


def test_write_ranks_writes_each_rank_in_its_place(tmp_path):
    import layerscope

    path = _benchmark("synthetic").write_ranks(tmp_path / "job", ranks=2, layers=3, steps=5)
    assert (path / "run.json").is_file()
    assert (path / "rank-00001" / "run.json").is_file()
    run = layerscope.load(path)
    assert run.meta["status"] == "finished"
    assert [entry["rank"] for entry in run.meta["ranks"]] == [0, 1]
    counts = run.sql("select rank, count(*) as n from stats group by rank order by rank")
    assert counts["rank"].tolist() == [0, 1]
    assert counts["n"].tolist() == [3 * 4 * 5, 3 * 4 * 5]
    # Rows carry their rank; weights are the same on both ranks, activations differ.
    kinds = run.sql(
        "select kind, count(distinct std) as values from stats where step = 4 and "
        "module = 'layers.1' group by kind order by kind"
    )
    assert dict(zip(kinds["kind"], kinds["values"], strict=True)) == {
        "activation": 2, "grad": 2, "weight": 1, "weight_grad": 1,
    }  # fmt: skip
    assert len(layerscope.load(path, ranks="merge").stats) == 3 * 4 * 5


def test_measure_reports_a_reader_over_its_bounds():
    scale = _benchmark("scale")
    python = sys.executable
    slow, _ = scale.measure([python, "-c", "import time; time.sleep(30)"], timeout=1, memory_gb=8)
    assert slow.failure == "over 1 s"
    grabbing = [python, "-c", "b = bytearray(2 << 30)"]
    large, _ = scale.measure(grabbing, timeout=30, memory_gb=0.5)
    assert large.failure == "over 0.5 GB"
    fine, out = scale.measure([python, "-c", "print(2 + 2)"], timeout=30, memory_gb=8)
    assert not fine.failure
    assert out.strip() == "4"
    assert fine.peak_mb > 0
