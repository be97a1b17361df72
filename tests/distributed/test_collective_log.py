"""The collective log itself, in one process; on 2 ranks test_ddp.py and test_fsdp.py check it
against torch's flight recorder."""

from __future__ import annotations

import torch
import torch.distributed as dist
from collective_log import CollectiveLog


def test_logs_collectives_in_order_with_their_tensors(one_rank_group):
    import torch.distributed._functional_collectives as funcol

    with CollectiveLog() as log:
        dist.all_reduce(torch.ones(3))
        _ = torch.ones(2) * 2  # not a collective
        funcol.all_reduce(torch.ones(2, 2), "sum", dist.group.WORLD).wait()
        dist.broadcast(torch.zeros(4, dtype=torch.int64), src=0)
    assert log.calls == [
        "c10d.allreduce_.default float32[3]",
        "_c10d_functional.all_reduce.default float32[2, 2]",
        "c10d.broadcast_.default int64[4]",
    ]
    assert log.counts() == {
        "c10d.allreduce_.default": 1,
        "_c10d_functional.all_reduce.default": 1,
        "c10d.broadcast_.default": 1,
    }


def test_logs_nothing_once_left(one_rank_group):
    with CollectiveLog() as log:
        pass
    dist.all_reduce(torch.ones(1))
    assert log.calls == []
