"""Every rank of a distributed job writes its own files under one run directory; load() reads
them as one run. The rank is taken when the first rows are written, not when the store starts.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.distributed._ranks import ProcessRank
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.store import ParquetStore

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

ROWS_A_STEP = 8  # Linear: activation, grad, weight, bias and their grads; ReLU: activation, grad


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


def _as_rank(monkeypatch, rank):
    """Make this process rank ``rank`` of 2, as torchrun's environment does; None: no job."""
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")


def _write(root, rank, steps, monkeypatch):
    """Train ``steps`` steps as rank ``rank``; the loss of step s is s + 10 * rank."""
    with monkeypatch.context() as patch:
        _as_rank(patch, rank)
        model = _model(seed=rank)
        with layerscope.watch(model, every=1, run=ParquetStore(root, flush_steps=1)) as scope:
            for step in range(steps):
                model(torch.randn(2, 4)).sum().backward()
                scope.step(loss=float(step + 10 * rank))
    return scope


def _files(directory):
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _info():
    return RunInfo(
        id="test",
        name="test",
        started=time.time(),
        place=ProcessRank(),
        config={},
        modules=[],
        histogram_edges=None,
    )


@pytest.fixture(autouse=True)
def _no_job(monkeypatch):
    _as_rank(monkeypatch, None)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_every_rank_writes_its_own_files_and_load_reads_them_as_one_run(
    tmp_path, monkeypatch, where
):
    parent = str(tmp_path) if where == "local" else f"memory://ranks/{tmp_path.name}"
    root = f"{parent}/job"
    _write(root, 1, steps=2, monkeypatch=monkeypatch)  # ranks come in any order
    _write(root, 0, steps=3, monkeypatch=monkeypatch)
    if where == "local":
        assert json.loads((tmp_path / "job" / "run.json").read_text())["rank"] == 0
        own = tmp_path / "job" / "rank-00001"
        assert json.loads((own / "run.json").read_text())["rank"] == 1
        assert sorted(p.name for p in own.iterdir()) == [
            "alerts",
            "calls.parquet",
            "modules.json",
            "run.json",
            "scalars",
            "stats",
        ]

    run = layerscope.load(root)
    alone = layerscope.load(f"{root}/rank-00001")  # a rank's directory reads as that rank
    stats = run.stats
    assert stats["rank"].value_counts().to_dict() == {0: 3 * ROWS_A_STEP, 1: 2 * ROWS_A_STEP}
    assert sorted(set(stats.query("rank == 0").step)) == [0, 1, 2]
    theirs = stats.query("rank == 1").reset_index(drop=True)
    assert theirs["mean"].tolist() == alone.stats["mean"].tolist()
    scalars = run.scalars
    assert scalars.groupby("rank").value.apply(list).to_dict() == {
        0: [0.0, 1.0, 2.0],
        1: [10.0, 11.0],
    }
    per_step = len(alone.calls) // 2  # every recorded step's order: rank 1 recorded 2 steps
    assert run.calls["rank"].value_counts().to_dict() == {0: 3 * per_step, 1: 2 * per_step}

    counted = run.sql("select rank, count(*) n from stats group by 1 order by 1")
    assert counted.n.tolist() == [3 * ROWS_A_STEP, 2 * ROWS_A_STEP]
    summed = run.sql("select rank, sum(value) v from scalars group by 1 order by 1")
    assert summed.v.tolist() == [3.0, 21.0]
    assert run.sql("select distinct rank from calls order by 1")["rank"].tolist() == [0, 1]

    meta = run.meta
    assert meta["rank"] == 0
    assert meta["status"] == "finished"
    assert [entry["rank"] for entry in meta["ranks"]] == [0, 1]
    assert [entry["steps"] for entry in meta["ranks"]] == [3, 2]
    assert {entry["pid"] for entry in meta["ranks"]} == {os.getpid()}
    assert {entry["status"] for entry in meta["ranks"]} == {"finished"}

    listed = layerscope.runs(parent)
    assert listed.name.tolist() == ["job"]
    assert listed.ranks.tolist() == [2]
    assert len(layerscope.runs(root)) == 0  # a rank's directory is not a run of its own


def test_the_rank_is_taken_at_the_first_rows_not_when_the_store_starts(tmp_path, monkeypatch):
    root = tmp_path / "job"
    model = _model()
    with layerscope.watch(model, every=1, run=ParquetStore(root, flush_seconds=0.05)) as scope:
        time.sleep(0.3)  # idle flushes: nothing to write, so the rank is not asked for
        assert json.loads((root / "run.json").read_text())["rank"] == 0  # started as rank 0's
        _as_rank(monkeypatch, 1)  # as init_process_group after watch() makes it known
        model(torch.randn(2, 4)).sum().backward()
        scope.step(loss=1.0)
    assert not (root / "run.json").exists()
    meta = json.loads((root / "rank-00001" / "run.json").read_text())
    assert (meta["rank"], meta["world_size"]) == (1, 2)
    run = layerscope.load(root)
    assert set(run.stats["rank"]) == {1}
    assert run.scalars["rank"].tolist() == [1]
    assert run.meta["rank"] == 1


def test_a_rank_whose_place_holds_another_run_drops_its_rows_and_touches_nothing(
    tmp_path, monkeypatch
):
    root = tmp_path / "job"
    _write(root, 1, steps=2, monkeypatch=monkeypatch)
    before = _files(root)
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The rank is unknown at start: the root is free, so watch() starts.
        with layerscope.watch(model, every=1, run=ParquetStore(root, flush_steps=1)) as scope:
            _as_rank(monkeypatch, 1)
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
                scope.step(loss=5.0)
    ours = [w for w in caught if issubclass(w.category, LayerscopeWarning)]
    assert len(ours) == 1
    assert "already holds a run" in str(ours[0].message)
    assert scope.failures >= 1
    assert _files(root) == before
    assert sorted(set(layerscope.load(root).stats.step)) == [0, 1]


def test_start_refuses_the_place_of_a_known_rank_that_holds_a_run(tmp_path, monkeypatch):
    root = tmp_path / "job"
    _write(root, 1, steps=1, monkeypatch=monkeypatch)
    before = _files(root)
    _as_rank(monkeypatch, 1)
    with pytest.raises(FileExistsError, match=r"^run: .*already holds a run"):
        layerscope.watch(_model(), run=root)
    assert _files(root) == before
    _write(root, 0, steps=1, monkeypatch=monkeypatch)  # rank 0's place is free
    assert [entry["rank"] for entry in layerscope.load(root).meta["ranks"]] == [0, 1]


def test_a_run_that_only_another_rank_wrote_loads_with_its_meta(tmp_path, monkeypatch):
    root = tmp_path / "job"
    _write(root, 1, steps=2, monkeypatch=monkeypatch)
    assert not (root / "run.json").exists()
    run = layerscope.load(root)
    assert run.meta["rank"] == 1
    assert run.meta["status"] == "finished"
    assert len(run.stats) == 2 * ROWS_A_STEP
    assert [m.name for m in run.modules if m.watched] == ["0", "1"]
    listed = layerscope.runs(tmp_path)
    assert listed.name.tolist() == ["job"]
    assert listed.ranks.tolist() == [1]


@pytest.mark.parametrize(
    ("rank_1", "expected"),
    [
        ({"status": "running", "pid": os.getpid()}, "running"),
        ({"status": "running", "updated": 0.0}, "crashed"),  # its heartbeat stopped long ago
        ({"status": "failed"}, "failed"),
        ({"status": "finished"}, "finished"),
    ],
)
def test_the_runs_status_is_the_worst_of_its_ranks(tmp_path, monkeypatch, rank_1, expected):
    root = tmp_path / "job"
    _write(root, 0, steps=1, monkeypatch=monkeypatch)
    _write(root, 1, steps=1, monkeypatch=monkeypatch)
    path = root / "rank-00001" / "run.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "updated": time.time(), **rank_1}))
    run = layerscope.load(root)
    assert run.meta["status"] == expected
    assert [entry["status"] for entry in run.meta["ranks"]] == ["finished", expected]


def test_discard_undoes_start_and_leaves_no_run_directory(tmp_path):
    made = tmp_path / "new" / "run"
    store = ParquetStore(made)
    store.start(_info())
    assert made.is_dir()
    store.discard()
    assert not made.exists()
    store.write(Records(scalars=[(0, "loss", 1.0)]))  # a discarded store writes nothing
    store.flush()
    store.close(RunSummary("failed", time.time(), 0, 0, 0, 0))
    assert not made.exists()

    wrote = ParquetStore(tmp_path / "wrote")  # rows written before discard go with it
    wrote.start(_info())
    wrote.write(Records(scalars=[(0, "loss", 1.0)]))
    wrote.flush()
    wrote.sync()
    assert (tmp_path / "wrote" / "run.json").exists()
    wrote.discard()
    assert not (tmp_path / "wrote").exists()

    closed = ParquetStore(tmp_path / "closed")  # also once closed, compacted and all
    closed.start(_info())
    closed.write(Records(scalars=[(0, "loss", 1.0)]))
    closed.flush()
    closed.write(Records(scalars=[(1, "loss", 0.5)]))
    closed.close(RunSummary("failed", time.time(), 2, 0, 0, 0))
    assert (tmp_path / "closed" / "run.json").exists()
    closed.discard()
    assert not (tmp_path / "closed").exists()

    (tmp_path / "kept").mkdir()  # a directory that was there before stays
    kept = ParquetStore(tmp_path / "kept")
    kept.start(_info())
    kept.discard()
    assert (tmp_path / "kept").is_dir()

    shared = ParquetStore(tmp_path / "shared")
    shared.start(_info())
    (tmp_path / "shared" / "rank-00001").mkdir()  # another rank wrote there meanwhile
    shared.discard()
    assert (tmp_path / "shared" / "rank-00001").is_dir()


def test_discard_removes_only_its_own_files_next_to_another_ranks(tmp_path, monkeypatch):
    root = tmp_path / "job"
    _write(root, 0, steps=1, monkeypatch=monkeypatch)
    before = _files(root)
    _as_rank(monkeypatch, 1)
    store = ParquetStore(root)
    store.start(_info())
    store.write(Records(scalars=[(0, "loss", 1.0)]))
    store.flush()
    store.sync()
    assert (root / "rank-00001" / "run.json").exists()
    store.discard()
    assert _files(root) == before
    assert not (root / "rank-00001").exists()


CHILD = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist, layerscope
    from layerscope.store import ParquetStore
    rank, root, rendezvous = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 2)
    # Watched before the process group is up: the rank is the environment's, as torchrun's.
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    scope = layerscope.watch(model, every=1, run=ParquetStore(root, flush_steps=1))
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=2)
    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
        scope.step(loss=float(rank))
    scope.close()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_processes_of_a_gloo_job_write_one_run(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    root = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(rank), str(root), str(tmp_path / "rendezvous")],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for child in children:
        _, stderr = child.communicate(timeout=240)
        assert child.returncode == 0, stderr
    run = layerscope.load(root)
    assert run.meta["status"] == "finished"
    assert [entry["rank"] for entry in run.meta["ranks"]] == [0, 1]
    assert run.stats.groupby("rank").step.nunique().to_dict() == {0: 3, 1: 3}
    assert (run.scalars["value"] == run.scalars["rank"]).all()
    assert (root / "rank-00001" / "run.json").exists()


def test_files_written_before_tables_had_a_rank_read_as_rank_0s(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    root = tmp_path / "job"
    _write(root, 0, steps=3, monkeypatch=monkeypatch)
    for table in ("scalars/*.parquet", "calls.parquet"):  # as an older layerscope wrote them
        for path in root.glob(table):
            pq.write_table(pq.read_table(path).drop_columns("rank"), path)
    alone = layerscope.load(root)
    assert alone.scalars["rank"].tolist() == [0, 0, 0]
    assert alone.sql("select distinct rank from calls")["rank"].tolist() == [0]
    _write(root, 1, steps=2, monkeypatch=monkeypatch)  # and next to a rank's that has one
    run = layerscope.load(root)
    assert run.scalars.groupby("rank").value.apply(list).to_dict() == {
        0: [0.0, 1.0, 2.0],
        1: [10.0, 11.0],
    }
    counted = run.sql("select rank, count(*) n from scalars group by 1 order by 1")
    assert counted.values.tolist() == [[0, 3], [1, 2]]
    assert run.sql("select count(*) n from calls where rank is null").n.item() == 0
