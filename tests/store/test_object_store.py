"""Runs written to and read from an object store: moto's S3 server in this process.

An object store has no directories and no rename: these check that a run is written there
whole (every table, compacted at close), read back while it is written and after, claimed by
one writer only, and that a bucket that is not there fails at ``watch()``.
"""

import gc
import math
import re
import warnings

import pandas as pd
import pytest
import torch
from torch import nn

import layerscope
from layerscope.store import ParquetStore, write_bytes

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

STEPS = 3
NAN_STEP = 1  # a NaN in the input: a nonfinite alert, so the run has alerts too


def _store(s3, url, **kwargs):
    return ParquetStore(url, flush_steps=1, storage_options=s3.options, **kwargs)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _steps(model, optimizer, scope, steps, first=0):
    generator = torch.Generator().manual_seed(1 + first)
    for step in range(first, first + steps):
        x = torch.randn(3, 4, generator=generator)
        if step == NAN_STEP:
            x[0, 0] = math.nan
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=float(step))


def _train(run):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=1, run=run) as scope:
        _steps(model, optimizer, scope, STEPS)


def _assert_same_frame(expected, actual):
    arrays = [name for name in expected if name in ("hist", "shape")]
    pd.testing.assert_frame_equal(expected.drop(columns=arrays), actual.drop(columns=arrays))
    for name in arrays:
        assert [list(v) for v in actual[name]] == [list(v) for v in expected[name]], name


def test_a_run_written_to_s3_reads_back_as_the_same_run_written_to_disk(s3, bucket, tmp_path):
    # Another run's files where exp[1], read as a pattern, would find them: they stay apart.
    decoys = ["exp1/run.json", "exp1/stats/seg-000001.parquet", "exp1/scalars/seg-000002.parquet"]
    for key in decoys:
        s3.client.put_object(Bucket=bucket, Key=key, Body=b"another run's")
    _train(tmp_path / "run")
    _train(_store(s3, f"s3://{bucket}/exp[1]"))
    on_disk = layerscope.load(tmp_path / "run")
    run = layerscope.load(f"s3://{bucket}/exp[1]", storage_options=s3.options)

    for table in ("stats", "scalars", "alerts", "calls"):
        _assert_same_frame(getattr(on_disk, table), getattr(run, table))
    assert run.alerts.rule.tolist() == ["nonfinite"]
    assert run.modules == on_disk.modules
    assert run.sql("select count(*) as n from stats").n.tolist() == [len(on_disk.stats)]
    assert run.meta["name"] == "exp[1]"
    assert run.meta["status"] == "finished"
    assert run.meta["steps"] == STEPS
    for count in ("written_rows", "written_scalars", "written_alerts", "dropped_rows"):
        assert run.meta[count] == on_disk.meta[count], count
    # Compacted at close, one file a table; no claim, reserve or temporary left behind.
    assert s3.keys(bucket) == sorted(
        [
            *decoys,
            "exp[1]/alerts/seg-000001.parquet",
            "exp[1]/calls.parquet",
            "exp[1]/modules.json",
            "exp[1]/run.json",
            f"exp[1]/scalars/data-000001-{STEPS:06d}.parquet",
            f"exp[1]/stats/data-000001-{STEPS:06d}.parquet",
        ]
    )


def test_a_run_being_written_to_s3_reads_while_open_and_once_closed(s3, bucket):
    url = f"s3://{bucket}/run"
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = layerscope.watch(model, optimizer=optimizer, every=1, run=_store(s3, url))
    _steps(model, optimizer, scope, 2)
    scope.flush()
    run = layerscope.load(url, storage_options=s3.options)
    assert run.meta["status"] == "running"
    assert sorted(set(run.stats.step)) == [0, 1]

    _steps(model, optimizer, scope, 1, first=2)
    scope.flush()
    # The same Run lists the files anew: no cached listing hides the new segment.
    assert sorted(set(run.stats.step)) == [0, 1, 2]
    assert run.sql("select max(step) as last from scalars").last.tolist() == [2]
    assert "run/.run.lock" in s3.keys(bucket)  # the writer's claim, while it writes
    scope.close()

    run = layerscope.load(url, storage_options=s3.options)
    assert run.meta["status"] == "finished"
    assert run.scalars.value.tolist() == [0.0, 1.0, 2.0]
    # Compacted at close: the alerts' one segment is all that is left of segments.
    assert [key for key in s3.keys(bucket) if "seg-" in key] == ["run/alerts/seg-000001.parquet"]


def test_the_command_and_runs_read_s3_with_the_options_of_fsspec_configuration(
    s3, bucket, monkeypatch, capsys
):
    import fsspec

    from layerscope.cli import main

    _train(_store(s3, f"s3://{bucket}/runs/a"))
    # What FSSPEC_S3='{"key": ...}' in the environment sets: the command takes no options.
    monkeypatch.setitem(fsspec.config.conf, "s3", s3.options)
    capsys.readouterr()
    assert main(["summary", f"s3://{bucket}/runs/a"]) == 0
    assert "finished" in capsys.readouterr().out
    assert main(["runs", f"s3://{bucket}/runs"]) == 0
    assert re.search(rf"^a +finished +{STEPS} +1 ", capsys.readouterr().out, re.MULTILINE)

    listed = layerscope.runs(f"s3://{bucket}/runs", storage_options=s3.options)
    assert listed[["name", "status", "steps", "ranks"]].values.tolist() == [
        ["a", "finished", STEPS, 1]
    ]
    # A folder on an object store exists while it holds files: none here, and no runs.
    assert layerscope.runs(f"s3://{bucket}/empty", storage_options=s3.options).empty
    with pytest.raises(FileNotFoundError, match="no folder at s3://no-such-bucket-0/runs"):
        layerscope.runs("s3://no-such-bucket-0/runs", storage_options=s3.options)


def test_a_bucket_that_does_not_exist_fails_at_watch_naming_the_run(s3):
    url = "s3://no-such-bucket-1/run"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one error, no warning beside it
        with pytest.raises(OSError, match=re.escape(f"cannot write the run's files in {url}")):
            layerscope.watch(_model(), run=_store(s3, url))
    assert not s3.bucket_exists("no-such-bucket-1")  # s3fs's makedirs would have made one
    with pytest.raises(FileNotFoundError, match=re.escape(f"no run at {url}")):
        layerscope.load(url, storage_options=s3.options)


def test_one_writer_holds_a_place_on_s3_and_a_finished_run_keeps_it(s3, bucket):
    url = f"s3://{bucket}/run"
    first = layerscope.watch(_model(), run=_store(s3, url))
    with pytest.raises(FileExistsError, match=re.escape(f"{url} is being written by another")):
        layerscope.watch(_model(), run=_store(s3, url))
    first.close()
    assert "run/.run.lock" not in s3.keys(bucket)
    with pytest.raises(FileExistsError, match=re.escape(f"{url} already holds a run")):
        layerscope.watch(_model(), run=_store(s3, url))
    assert layerscope.load(url, storage_options=s3.options).meta["status"] == "finished"


def test_a_claim_left_with_no_run_is_named_and_nothing_is_written(s3, bucket):
    s3.client.put_object(Bucket=bucket, Key="run/.run.lock", Body=b'{"pid": 7, "host": "gone"}')
    with pytest.raises(FileExistsError, match=r"\(pid 7 on host 'gone'\).*remove it"):
        layerscope.watch(_model(), run=_store(s3, f"s3://{bucket}/run"))
    assert s3.keys(bucket) == ["run/.run.lock"]


def test_an_upload_that_fails_leaves_nothing_and_one_that_ends_appears_whole(s3, bucket):
    import s3fs

    # Parts of 5 MiB (the least S3 takes): a file of 6 MiB is a multipart upload.
    fs = s3fs.S3FileSystem(**s3.options, default_block_size=5 * 2**20, skip_instance_cache=True)
    path = f"{bucket}/run/stats/seg-000001.parquet"
    payload = bytes(range(256)) * (6 * 2**12)

    def fails_midway(file):
        file.write(payload)
        file.flush()  # the first part is uploaded
        raise RuntimeError("disk gone")

    from layerscope.store._files import atomic_write

    with pytest.raises(RuntimeError, match="disk gone"):
        atomic_write(fs, path, fails_midway)
    gc.collect()  # an abandoned file must not complete its upload when it is collected
    assert s3.keys(bucket) == []
    assert s3.pending_uploads(bucket) == []

    write_bytes(fs, path, payload)
    assert s3.keys(bucket) == ["run/stats/seg-000001.parquet"]
    assert fs.cat_file(path) == payload


def test_storage_options_must_be_a_mapping_of_names():
    with pytest.raises(TypeError, match="storage_options: expected a dict"):
        ParquetStore("s3://bucket/run", storage_options=["key"])
    with pytest.raises(TypeError, match="storage_options: expected a dict"):
        layerscope.load("s3://bucket/run", storage_options={1: "key"})
    with pytest.raises(TypeError, match="storage_options: expected a dict"):
        layerscope.watch(_model(), run="s3://bucket/run", storage_options="key=testing")


def test_watch_takes_the_storage_options_and_a_new_run_finds_its_free_name_with_them(
    s3, bucket, monkeypatch
):
    import fsspec

    monkeypatch.setattr(fsspec.config, "conf", {})  # only the options given reach the store
    url = f"s3://{bucket}/runs/exp"
    for expected in (url, f"{url}-2"):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with layerscope.watch(
            model,
            optimizer=optimizer,
            every=1,
            run=url,
            storage_options=s3.options,
            if_exists="new",
        ) as scope:
            _steps(model, optimizer, scope, STEPS)
        assert scope.run_path == expected
        run = layerscope.load(expected, storage_options=s3.options)
        assert sorted(set(run.stats["step"])) == list(range(STEPS))
    assert "runs/exp-2/run.json" in s3.keys(bucket)


def test_storage_options_belong_to_a_path_not_to_a_store_or_no_run():
    store = ParquetStore("s3://bucket/run", storage_options={"anon": True})
    with pytest.raises(TypeError, match="storage_options: a ParquetStore given as run= takes"):
        layerscope.watch(_model(), run=store, storage_options={"anon": True})
    with pytest.raises(ValueError, match=r"storage_options: .* but run is None"):
        layerscope.watch(_model(), storage_options={"anon": True})
