"""``ranks="merge"``: rank 0 writes whole-job rows equal to one process's over all the data."""

from __future__ import annotations

import math

import pytest
from tests.distributed.conftest import launch

pytestmark = pytest.mark.slow  # a torchrun launch each, about 10 s

STATS = ("numel", "mean", "std", "min", "max", "l2", "e4m3_over", "e4m3_under", "e5m2_under")


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def merged(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"merge-{request.param}")
    job = launch("worker_merge.py", directory, request.param)
    job.assert_succeeded()
    return (
        request.param,
        job.read("expected.json"),
        job.read("loaded.json"),
        job.read("each_merged.json"),
    )


def same(a, b):
    return (a != a and b != b) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_only_rank_0_writes_statistics_of_recorded_steps(merged):
    _, expected, loaded, _ = merged
    assert expected["failures"] == 0
    assert {row["rank"] for row in loaded["stats"]} == {0}
    assert [rank["status"] for rank in loaded["ranks"]] == ["finished", "finished"]


def test_activations_equal_those_of_the_concatenated_batch(merged):
    kind, expected, loaded, _ = merged
    rows = {
        (row["phase"], row["step"], row["module"]): row
        for row in loaded["stats"]
        if row["kind"] == "activation"
    }
    assert len(rows) == len(expected["activations"])
    for reference in expected["activations"]:
        row = rows[(reference["phase"], reference["step"], reference["module"])]
        for stat in STATS:
            assert same(row[stat], reference[stat]), (reference, stat, row[stat])
    # The counts fp8 would lose are compared too, and some are not zero here.
    assert any(reference["e4m3_under"] for reference in expected["activations"])
    phases = {phase for phase, _, _ in rows}
    # Rank 0 alone evaluated under DDP: rows rank 1 never had merge all the same.
    assert phases == ({"train", "eval"} if kind == "ddp" else {"train"})


def test_parameters_are_whole_whether_replicated_or_sharded(merged):
    _, expected, loaded, _ = merged
    rows = {
        (row["step"], row["module"], row["tensor"]): row
        for row in loaded["stats"]
        if row["kind"] == "weight"
    }
    assert len(rows) == len(expected["weights"])
    for reference in expected["weights"]:
        row = rows[(reference["step"], reference["module"], reference["tensor"])]
        for stat in STATS:
            assert same(row[stat], reference[stat]), (reference, stat, row[stat])
        assert row["shard"] is None  # a shard's row is of its whole parameter
    shapes = {(row["module"], row["tensor"]): tuple(row["shape"]) for row in rows.values()}
    assert shapes[("0", "weight")] == (6, 4)
    assert shapes[("4", "weight")] == (1, 3)  # rank 1's shard of it is empty under FSDP2


def test_the_reader_merges_a_run_of_each_ranks_rows_the_same(merged):
    _, _, loaded, each_merged = merged

    def rows(stats):
        return {
            (row["phase"], row["step"], row["module"], row["kind"], row["tensor"]): row
            for row in stats
            if not row.get("sentinel")
        }

    live, read = rows(loaded["stats"]), rows(each_merged["stats"])
    assert set(read) == set(live)
    for key, row in live.items():
        for stat in STATS:
            assert same(read[key][stat], row[stat]), (key, stat)
        assert read[key]["shape"] == row["shape"]
        assert read[key]["rank"] == 0
        # Histograms: the live merge's equal the sum of the ranks' own, slot by slot.
        assert read[key]["hist"] == row["hist"], key
        assert sum(row["hist"]) == row["numel"]
