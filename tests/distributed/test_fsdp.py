"""FSDP2 (``fully_shard`` on each Linear and the root) on 2 gloo ranks, one run directory.

Parameters, their gradients and updates are DTensors sharded along dim 0; layerscope must read
each rank's shard (``to_local()``) and issue no collective of its own. The model's last layer
has one output row: rank 1 holds empty shards of it.
"""

from __future__ import annotations

import pytest
import torch
from checks import (
    STATS,
    assert_log_matches_flight_recorder,
    assert_same_collectives,
    compare_with_expected,
    loaded_stats,
    rows_of,
)
from torch import nn
from training_job import STEPS, mlp

import layerscope

pytestmark = pytest.mark.slow  # the torchrun launch that most tests share takes about 10 s

LAYERS = 3  # Linear layers, each sharded on its own
PARAM_KINDS = {"weight", "weight_grad", "update"}


def test_training_completes_with_no_failures(fsdp_job):
    fsdp_job.assert_succeeded()  # no hang, no abort on a collective mismatch
    assert [result["watched"]["failures"] for result in fsdp_job.ranks()] == [0, 0]


def test_every_parameter_has_rows_on_both_ranks_at_every_step(fsdp_job):
    stats = loaded_stats(fsdp_job)
    params = [name.split(".") for name, _ in mlp().named_parameters()]  # [module, tensor]
    for rank in (0, 1):
        recorded = rows_of(stats, rank)
        missing = [
            (step, module, kind, tensor)
            for step in range(STEPS)
            for module, tensor in params
            for kind in sorted(PARAM_KINDS)
            if (step, module, kind, tensor) not in recorded
        ]
        assert not missing, f"rank {rank}: no rows for {missing}"


def test_parameter_rows_are_of_the_local_shard(fsdp_job):
    stats = loaded_stats(fsdp_job)
    params = stats[stats["kind"].isin(PARAM_KINDS)]
    for rank in (0, 1):
        assert set(params[params["rank"] == rank]["shard"]) == {f"{rank}/2"}
    others = stats[~stats["kind"].isin(PARAM_KINDS)]
    assert others["shard"].isna().all()  # activations and their gradients are plain tensors
    # numel and every statistic are those of the shard the worker read with to_local().
    compare_with_expected(stats, fsdp_job.ranks(), STATS, PARAM_KINDS)


def test_empty_shards_have_rows(fsdp_job):
    stats = loaded_stats(fsdp_job)
    last = stats[(stats["rank"] == 1) & (stats["module"] == "4") & stats["kind"].isin(PARAM_KINDS)]
    assert len(last) == STEPS * 2 * len(PARAM_KINDS)
    assert set(last["numel"]) == {0}


def test_watched_run_issues_the_collectives_of_the_unwatched_run(fsdp_job):
    assert_same_collectives(fsdp_job.ranks())


def test_collective_log_sees_all_gathers_and_reduce_scatters(fsdp_job):
    for result in fsdp_job.ranks("plain"):
        calls = result["plain"]["collectives"]
        print(f"rank {result['rank']}: {calls}")
        ops = [call.split(" ", 1)[0] for call in calls]
        # Each layer is gathered for its forward and again for its backward, and its
        # gradients reduce-scattered once a step.
        assert ops.count("c10d._allgather_base_.default") == 2 * LAYERS * STEPS
        assert ops.count("c10d._reduce_scatter_base_.default") == LAYERS * STEPS
        assert_log_matches_flight_recorder(result)


def test_one_rank_fsdp2_records_its_shards_without_failures(one_rank_group):
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=1, kinds=tuple(PARAM_KINDS)) as scope:
        model(torch.randn(8, 4)).square().mean().backward()
        grads = {name: p.grad.to_local().clone() for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
    assert scope.failures == 0
    frame = scope.frame()
    assert len(frame) == len(grads) * len(PARAM_KINDS)
    assert set(frame["shard"]) == {"0/1"}
    recorded = frame[frame["kind"] == "weight_grad"].set_index(["module", "tensor"])
    for name, grad in grads.items():
        row = recorded.loc[tuple(name.split("."))]
        assert row["numel"] == grad.numel()
        assert row["mean"] == pytest.approx(grad.double().mean().item(), rel=1e-6)


def test_the_noise_scale_under_fsdp2_is_one_warning_and_no_estimate(one_rank_group):
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(layerscope.LayerscopeWarning, match="noise_scale: not available under FSDP"):
        scope = layerscope.watch(model, optimizer=optimizer, every=1, noise_scale=8)
    with scope:
        for _ in range(2):  # two micro-batches: an estimate, were the gradients seen
            (model(torch.randn(8, 4)).square().mean() / 2).backward()
        optimizer.step()
    assert scope.failures == 1
    scalars = scope.frame("scalars")
    assert not scalars.name.str.startswith("noise/").any()
    assert len(scope.frame()) > 0  # the rest is recorded
