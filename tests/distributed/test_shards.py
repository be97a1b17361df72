"""``layerscope.distributed._shards``: a DTensor's local shard and its label, with no collective."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from collective_log import CollectiveLog
from torch import nn

from layerscope.distributed._shards import _label, local_tensor, shard_label


def test_plain_tensors_and_parameters_pass_through():
    tensor, param = torch.randn(3), nn.Parameter(torch.randn(2, 2))
    assert local_tensor(tensor) is tensor
    assert local_tensor(param) is param
    assert shard_label(tensor) is None
    assert shard_label(param) is None
    assert shard_label(torch.empty(0)) is None


def test_plain_tensors_do_not_import_torch_distributed_tensor():
    code = (
        "import sys, torch\n"
        "from layerscope.distributed._shards import local_tensor, shard_label\n"
        "for t in (torch.ones(2), torch.nn.Parameter(torch.ones(2))):\n"
        "    local_tensor(t), shard_label(t)\n"
        "assert 'torch.distributed.tensor' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def placements():
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return {
        "S0": Shard(0),
        "S1": Shard(1),
        "R": Replicate(),
        "P": Partial(),
        "SS": _StridedShard(0, split_factor=2),
    }


@pytest.mark.parametrize(
    ("names", "coordinate", "mesh", "label"),
    [
        (["S0"], [1], [4], "1/4"),
        (["R"], [3], [4], None),
        (["P"], [1], [2], None),  # partial sums: each rank holds all elements
        (["SS"], [1], [2], "1/2"),  # FSDP2 over tensor parallelism
        (["S0", "S1"], [1, 0], [2, 2], "2/4"),  # row-major over the sharded dims
        (["S0", "S1"], [1, 1], [2, 3], "4/6"),
        (["S1", "S0"], [0, 2], [2, 3], "2/6"),  # which tensor dim does not matter
        (["R", "S0"], [1, 2], [2, 3], "2/3"),  # HSDP: replicas of the same shard
        (["S0", "R"], [1, 2], [2, 3], "1/2"),
        (["SS", "S0"], [1, 1], [2, 2], "3/4"),
        (["P", "R"], [1, 0], [2, 2], None),
        (["S0"], [0], [1], "0/1"),  # sharded over one rank: the whole tensor
    ],
)
def test_label_numbers_shards_over_the_sharded_mesh_dims(
    placements, names, coordinate, mesh, label
):
    assert _label([placements[n] for n in names], coordinate, mesh) == label


def test_one_rank_dtensors(one_rank_group):
    from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    local = torch.randn(4, 2, requires_grad=True)
    sharded = DTensor.from_local(local, mesh, [Shard(0)]) * 3  # with a graph behind it
    replica = DTensor.from_local(torch.randn(2), mesh, [Replicate()])
    with CollectiveLog() as log:
        labels = shard_label(sharded), shard_label(replica)
        shard = local_tensor(sharded)
    assert labels == ("0/1", None)
    assert type(shard) is torch.Tensor
    assert shard.grad_fn is None  # no autograd node made for the reading
    assert shard.data_ptr() == sharded.to_local().data_ptr()  # not a copy
    assert torch.equal(shard, local.detach() * 3)
    assert log.calls == []


# The two-rank tests share one torchrun launch (worker_shards.py) of about 8 s.
@pytest.mark.slow
def test_two_rank_labels_follow_the_mesh_coordinate(shards_job):
    for result in shards_job.ranks():
        rank = result["rank"]
        assert result["labels"] == {
            "(2) shard": f"{rank}/2",
            "(2) strided shard": f"{rank}/2",
            "(2) replicate": None,
            "(2) partial": None,
            "(2,1) shard shard": f"{rank}/2",
            "(2,1) replicate shard": "0/1",
            "(1,2) shard shard": f"{rank}/2",
            "(1,2) shard replicate": "0/1",
            "(1,2) replicate replicate": None,
            "(2) shard, with grad_fn": f"{rank}/2",
            "fsdp weight": f"{rank}/2",
            "fsdp weight.grad": f"{rank}/2",
        }


@pytest.mark.slow
def test_two_rank_local_tensors_are_the_shards_as_stored(shards_job):
    for result in shards_job.ranks():
        rank = result["rank"]
        assert all(result["same_storage"].values()), result["same_storage"]
        assert all(result["plain"].values()), result["plain"]
        assert not any(result["grad_fn"].values()), result["grad_fn"]
        rows = 2 if rank == 0 else 1  # nn.Linear(4, 3) split unevenly along dim 0
        assert result["shapes"]["fsdp weight"] == [rows, 4]
        assert result["shapes"]["fsdp weight.grad"] == [rows, 4]


@pytest.mark.slow
def test_two_rank_helpers_issue_no_collective(shards_job):
    for result in shards_job.ranks():
        assert result["collectives"] == []
        # The same log saw the all-reduce of a DTensor reduction made visible.
        assert result["control"] == ["_c10d_functional.all_reduce.default float32[]"]
