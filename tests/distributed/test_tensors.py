"""watch(tensors=) under DDP on 2 gloo ranks: each rank keeps its own tensors in its place."""

from __future__ import annotations

import json

import pytest
import torch
from tests.distributed.conftest import launch

import layerscope

pytestmark = pytest.mark.slow  # one torchrun launch
pytest.importorskip("safetensors")


def test_each_rank_keeps_its_own_whole_tensors(tmp_path):
    job = launch("worker_tensors.py", tmp_path)
    job.assert_succeeded()
    for rank in (0, 1):
        result = json.loads((tmp_path / f"tensors{rank}.json").read_text())
        assert result["steps"] == [0, 2]
        assert all(result["equal"])
    run = tmp_path / "run"
    ranks = [layerscope.load(run).tensors, layerscope.load_capture(run / "rank-00001" / "tensors")]
    by_rank = [{(r.step, r.kind, r.tensor): r.value for r in kept} for kept in ranks]
    assert sorted(by_rank[0]) == sorted(by_rank[1])
    for key in by_rank[0]:
        same = torch.equal(by_rank[0][key], by_rank[1][key])
        # DDP keeps the weights equal on every rank; each rank's batches are its own.
        assert same == (key[1] == "weight"), key
