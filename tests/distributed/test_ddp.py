"""DDP on 2 gloo ranks, one run directory for both: see worker_train.py for what they do."""

from __future__ import annotations

import pytest
from checks import (
    STATS,
    assert_log_matches_flight_recorder,
    assert_same_collectives,
    compare_with_expected,
    loaded_stats,
    rows_of,
)
from training_job import STEPS

pytestmark = pytest.mark.slow  # one torchrun launch, about 10 s


def test_both_ranks_write_rows_into_one_run(ddp_job):
    ddp_job.assert_succeeded()
    stats = loaded_stats(ddp_job)
    assert set(stats["rank"]) == {0, 1}
    rank0, rank1 = rows_of(stats, 0), rows_of(stats, 1)
    assert sorted({key[0] for key in rank0}) == list(range(STEPS))
    assert rank0.keys() == rank1.keys()  # the same steps, modules, kinds and tensors
    assert set(stats["kind"]) == {"activation", "grad", "weight", "weight_grad", "update"}
    assert stats["shard"].isna().all()  # DDP replicates: no row is of a shard
    # Each rank saw its own batches: these are two ranks' rows, not one rank's twice.
    key = (0, "0", "activation", "out")
    assert rank0[key]["mean"] != rank1[key]["mean"]


def test_run_meta_lists_both_ranks_as_finished(ddp_job):
    ranks = ddp_job.read("loaded.json")["ranks"]
    assert [(r["rank"], r["status"], r["steps"]) for r in ranks] == [
        (0, "finished", STEPS),
        (1, "finished", STEPS),
    ]


def test_weight_grads_are_the_all_reduced_gradients(ddp_job):
    ranks = ddp_job.ranks()
    stats = loaded_stats(ddp_job)
    compare_with_expected(stats, ranks, STATS, {"weight_grad"})
    # The worker read them after backward: all-reduced, the same on both ranks.
    grads = [
        [row for row in result["expected"] if row["kind"] == "weight_grad"] for result in ranks
    ]
    assert grads[0] == grads[1]


def test_weights_and_updates_are_those_of_the_optimizer_step(ddp_job):
    compare_with_expected(loaded_stats(ddp_job), ddp_job.ranks(), STATS, {"weight", "update"})


def test_watched_run_issues_the_collectives_of_the_unwatched_run(ddp_job):
    ranks = ddp_job.ranks()
    assert [result["watched"]["failures"] for result in ranks] == [0, 0]
    assert_same_collectives(ranks)


def test_collective_log_sees_the_all_reduce_of_every_step(ddp_job):
    for result in ddp_job.ranks("plain"):
        calls = result["plain"]["collectives"]
        print(f"rank {result['rank']}: {calls}")
        # One bucket (the model is tiny), all-reduced once per step; DDP's second forward
        # rebuilds its buckets and broadcasts their order, with no all-reduce.
        all_reduces = [call for call in calls if call.startswith("c10d.allreduce_")]
        assert len(all_reduces) == STEPS
        assert_log_matches_flight_recorder(result)
