"""Whole tensors of a run on an object store: moto's S3 server in this process.

``watch(tensors=...)`` keeps each step's tensors as a safetensors part in the run's
``tensors/``. On S3 no folder is made for them (s3fs's makedirs, which makes a bucket where
there is none, fails here), each part is uploaded whole under its final name, a place's parts
are never written over, and ``load(...).tensors`` reads them back, a damaged one left out.
"""

import re
import warnings

import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.store import ParquetStore

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
pytest.importorskip("safetensors")
s3fs = pytest.importorskip("s3fs")

STEPS = 3
TENSORS = {"include": "^0$", "kinds": "activation"}  # the first layer's output: a part a step


def _parts(*numbers):
    """The keys of the parts ``numbers`` of the run at ``run/``."""
    return [f"run/tensors/part-{number:06d}.safetensors" for number in numbers]


@pytest.fixture(autouse=True)
def no_folders(monkeypatch):
    """No folder is asked for on the object store: s3fs would make a bucket for one."""

    async def refuse(self, path, *args, **kwargs):
        raise PermissionError(f"a folder was asked for on an object store: {path}")

    monkeypatch.setattr(s3fs.S3FileSystem, "_mkdir", refuse)


def _store(options, url):
    return ParquetStore(url, flush_steps=1, storage_options=options)


def _train(run, steps=STEPS, rows=3, width=8, parts_before=0):
    """Train ``steps`` steps keeping layer 0's output; its outputs, as a hook of ours saw them.

    ``parts_before``: how many parts the place holds already.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    seen = []
    model[0].register_forward_hook(lambda _module, _args, out: seen.append(out.detach().clone()))
    generator = torch.Generator().manual_seed(1)
    with layerscope.watch(model, run=run, every=1, alerts=False, tensors=TENSORS) as scope:
        # No part of its own yet: on S3 a prefix with nothing under it, or only others'.
        assert len(scope.tensors.records) == parts_before
        for _ in range(steps):
            model(torch.randn(rows, 4, generator=generator)).sum().backward()
            scope.step()
    return seen


def _assert_kept(records, outputs, steps):
    """``records`` are layer 0's outputs at ``steps``, bit for bit."""
    assert [(r.module, r.kind, r.tensor, r.step) for r in records] == [
        ("0", "activation", "out", step) for step in steps
    ]
    for record, step in zip(records, steps, strict=True):
        assert record.value.dtype == outputs[step].dtype
        assert torch.equal(record.value, outputs[step]), step


def _object(s3, bucket, key):
    return s3.client.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_whole_tensors_on_s3_read_back_bit_equal_and_as_the_same_run_on_disk(s3, bucket, tmp_path):
    url = f"s3://{bucket}/run"
    outputs = _train(_store(s3.options, url))
    _train(tmp_path / "run")  # the same training, its run on the disk
    run = layerscope.load(url, storage_options=s3.options)
    on_disk = layerscope.load(tmp_path / "run")

    _assert_kept(run.tensors.records, outputs, range(STEPS))
    for mine, theirs in zip(run.tensors.records, on_disk.tensors.records, strict=True):
        assert mine.metadata() == theirs.metadata()
        assert torch.equal(mine.value, theirs.value)
    # Exactly the parts, each the file the disk has; nothing beside them but the run's.
    assert s3.keys(bucket) == sorted(
        [
            *_parts(1, 2, 3),
            "run/calls.parquet",
            "run/modules.json",
            "run/run.json",
            f"run/stats/data-000001-{STEPS:06d}.parquet",
        ]
    )
    for key in _parts(1, 2, 3):
        assert _object(s3, bucket, key) == (tmp_path / key).read_bytes(), key
    assert s3.pending_uploads(bucket) == []
    # The folder read alone, as a rank's: load_capture takes the same options.
    alone = layerscope.load_capture(f"{url}/tensors", storage_options=s3.options)
    _assert_kept(alone.records, outputs, range(STEPS))
    with pytest.raises(FileNotFoundError, match=r"dir: no run's whole tensors at s3://"):
        layerscope.load_capture(f"{url}/stats", storage_options=s3.options)


@pytest.mark.parametrize("where", ["s3", "disk"])
def test_parts_already_in_the_place_stay_and_the_run_numbers_its_own_after_them(
    s3, bucket, tmp_path, where
):
    # Another writer's two parts in the place, and no run.json: a run may be written there.
    earlier = _train(tmp_path / "earlier", steps=2, rows=5)
    kept = {key: (tmp_path / "earlier" / key[len("run/") :]).read_bytes() for key in _parts(1, 2)}
    if where == "s3":
        for key, payload in kept.items():
            s3.client.put_object(Bucket=bucket, Key=key, Body=payload)
        run_path = f"s3://{bucket}/run"
        outputs = _train(_store(s3.options, run_path), parts_before=2)
        run = layerscope.load(run_path, storage_options=s3.options)
        names = [key for key in s3.keys(bucket) if "/tensors/" in key]
        now = {key: _object(s3, bucket, key) for key in kept}
    else:
        (tmp_path / "run" / "tensors").mkdir(parents=True)
        for key, payload in kept.items():
            (tmp_path / key).write_bytes(payload)
        outputs = _train(tmp_path / "run", parts_before=2)
        run = layerscope.load(tmp_path / "run")
        names = sorted(f"run/tensors/{p.name}" for p in (tmp_path / "run" / "tensors").iterdir())
        now = {key: (tmp_path / key).read_bytes() for key in kept}

    assert names == _parts(1, 2, 3, 4, 5)
    assert now == kept  # not written over
    records = run.tensors.records
    _assert_kept(records[:2], earlier, range(2))
    _assert_kept(records[2:], outputs, range(STEPS))


def test_a_part_whose_upload_fails_leaves_nothing_and_the_next_parts_are_written(
    s3, bucket, monkeypatch
):
    # Blocks of 5 MiB (the least S3 takes): a part of 5.5 MiB is a multipart upload, begun as
    # it is written; the second part's last request, the upload's completion, fails.
    options = {**s3.options, "default_block_size": 5 * 2**20}
    failing = _parts(2)[0]
    complete = s3fs.core.S3File.commit
    attempts = []

    def commit(file):
        if file.key == failing:
            attempts.append((file.mpu is not None, len(file.parts)))
            raise ConnectionResetError("the connection was reset")
        complete(file)

    monkeypatch.setattr(s3fs.core.S3File, "commit", commit)
    url = f"s3://{bucket}/run"
    with pytest.warns(LayerscopeWarning, match="writing whole tensors failed"):
        outputs = _train(_store(options, url), rows=1400, width=1024)
    assert outputs[0].numel() * 4 > 5 * 2**20
    assert attempts == [(True, 1)]  # its data uploaded, the completion refused

    # Nothing of it: no object, no upload left begun; the parts before and after it whole.
    assert [key for key in s3.keys(bucket) if "/tensors/" in key] == _parts(1, 3)
    assert s3.pending_uploads(bucket) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing damaged to skip
        records = layerscope.load(url, storage_options=options).tensors.records
    _assert_kept(records, outputs, [0, 2])


# case -> how the second part is damaged, and words its reason holds.
DAMAGE = {
    "garbage": (lambda s3, bucket, key: s3.client.put_object(
        Bucket=bucket, Key=key, Body=b"not a safetensors file at all"), "not a safetensors file"),
    "truncated": (lambda s3, bucket, key: s3.client.put_object(
        Bucket=bucket, Key=key, Body=_object(s3, bucket, key)[:100]), "not a safetensors file"),
    "a-folder": (lambda s3, bucket, key: (
        s3.client.delete_object(Bucket=bucket, Key=key),
        s3.client.put_object(Bucket=bucket, Key=f"{key}/stray", Body=b"x"),
    ), "a folder, not a file"),
}  # fmt: skip


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_part_on_s3_is_left_out_named_and_the_others_read(s3, bucket, case):
    url = f"s3://{bucket}/run"
    outputs = _train(_store(s3.options, url))
    damage, reason = DAMAGE[case]
    damaged = _parts(2)[0]
    damage(s3, bucket, damaged)

    run = layerscope.load(url, storage_options=s3.options)
    path = f"{bucket}/{damaged}"
    with pytest.warns(LayerscopeWarning, match=rf"skipped {re.escape(path)}, .*{reason}"):
        records = run.tensors.records
    _assert_kept(records, outputs, [0, 2])
    assert list(run.skipped) == [path]
    assert reason in run.skipped[path]
