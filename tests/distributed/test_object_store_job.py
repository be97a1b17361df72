"""Two gloo ranks of a DDP job write one run to an S3 server (moto's, in this process) and read
it back as one: see worker_object_store.py for what they do."""

from __future__ import annotations

import json

import pytest
from tests.store.object_store_server import s3_server
from training_job import STEPS

from conftest import launch

pytestmark = pytest.mark.slow  # one torchrun launch, about 10 s


def test_two_ranks_write_one_run_to_s3_and_it_reads_back_with_both(tmp_path):
    with s3_server() as s3:
        bucket = s3.new_bucket()
        url = f"s3://{bucket}/job"
        job = launch("worker_object_store.py", tmp_path, url, json.dumps(s3.options))
        job.assert_succeeded()
        keys = s3.keys(bucket)
    assert [result["failures"] for result in job.ranks()] == [0, 0]
    loaded = job.read("loaded.json")
    assert [(r["rank"], r["status"], r["steps"]) for r in loaded["ranks"]] == [
        (0, "finished", STEPS),
        (1, "finished", STEPS),
    ]
    assert loaded["skipped"] == {}
    assert loaded["rows"]["0"] > 0
    assert loaded["keys"]["0"] == loaded["keys"]["1"]  # the same steps, modules and kinds
    # Each rank its own place under the one URL, each table compacted at close, no claim left.
    for place in ("job", "job/rank-00001"):
        assert f"{place}/run.json" in keys
        assert f"{place}/stats/data-000001-{STEPS:06d}.parquet" in keys
        assert f"{place}/scalars/data-000001-{STEPS:06d}.parquet" not in keys  # no scalars
    assert not [key for key in keys if "seg-" in key or key.endswith(".run.lock")]
