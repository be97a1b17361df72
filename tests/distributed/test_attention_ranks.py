"""watch(attention=True) under DDP and FSDP2 on 2 gloo ranks: each rank's heads, its own rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import launch

pytestmark = pytest.mark.slow  # one torchrun launch, about 15 s

HEADS, STEPS = 4, 3
VALUES = ["entropy_mean", "entropy_min", "entropy_frac", "max_prob"]


@pytest.fixture(scope="module")
def attention_job(tmp_path_factory):
    return launch("worker_attention.py", tmp_path_factory.mktemp("attention"))


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_each_rank_records_the_heads_of_its_own_batch(attention_job, kind):
    attention_job.assert_succeeded()
    for result in attention_job.ranks():
        mine = result[kind]
        assert mine["failures"] == 0
        rows = pd.DataFrame(mine["rows"])
        assert (rows["rank"] == result["rank"]).all()
        assert len(rows) == STEPS * 2 * HEADS
        for module, want in mine["expected"].items():
            first = rows[(rows.step == 0) & (rows.module == module)].sort_values("head")
            got = first[VALUES].to_numpy()
            np.testing.assert_allclose(got, np.array(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_the_stored_run_holds_both_ranks_rows(attention_job, kind):
    stored = pd.DataFrame(attention_job.read(f"{kind}_loaded.json"))
    for result in attention_job.ranks():
        own = stored[stored["rank"] == result["rank"]]
        seen = pd.DataFrame(result[kind]["rows"])
        order = ["step", "module", "head"]
        own = own.sort_values(order).reset_index(drop=True)
        seen = seen.sort_values(order).reset_index(drop=True)
        np.testing.assert_array_equal(own.entropy_mean, seen.entropy_mean)
