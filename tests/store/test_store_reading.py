"""Reading runs back: clear errors for bad paths, full schemas of empty tables, shards, exit."""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from torch import nn

import layerscope
from layerscope.distributed._ranks import ProcessRank
from layerscope.model._identities import Form, Identities, Identity
from layerscope.model._kinds import Kind
from layerscope.sinks import StatsRows
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.store import ParquetStore

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


@pytest.mark.parametrize("path", [None, 123, ["runs/a"]])
def test_load_of_something_not_a_path_is_a_type_error_naming_path(path):
    with pytest.raises(TypeError, match=r"^path: "):
        layerscope.load(path)


def test_load_of_a_file_says_it_is_not_a_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("not a run")
    with pytest.raises(NotADirectoryError, match=r"^path: .*notes\.txt"):
        layerscope.load(tmp_path / "notes.txt")


def test_runs_of_a_missing_folder_fails_naming_root_and_an_empty_one_lists_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^root: .*typo"):
        layerscope.runs(tmp_path / "typo" / "dir")
    with pytest.raises(TypeError, match=r"^root: "):
        layerscope.runs(None)
    listed = layerscope.runs(tmp_path)
    assert len(listed) == 0
    assert list(listed.columns) == [
        "name",
        "path",
        "status",
        "steps",
        "ranks",
        "started",
        "ended",
        "error",
    ]


def test_a_run_without_stats_rows_has_an_empty_stats_table_of_the_full_schema(tmp_path):
    stats = ["mean", "nan_count", "hist", {"rms": lambda t: t.pow(2).mean().sqrt()}]
    model = _model()
    with layerscope.watch(model, run=tmp_path / "r", kinds="activation", stats=stats) as s:
        for step in range(3):
            s.step(loss=float(step))  # no forward: nothing but scalars
    with layerscope.watch(model, every=1, kinds="activation", stats=stats) as in_memory:
        model(torch.ones(1, 4)).sum().backward()
        in_memory.step()
    run = layerscope.load(tmp_path / "r")
    stats = run.stats
    assert len(stats) == 0
    assert list(stats.columns) == list(in_memory.frame().columns)
    assert "hist" in stats
    assert "shard" in stats
    assert stats.step.dtype == np.int64
    assert stats["mean"].dtype == np.float64
    assert stats["nan_count"].dtype == np.int64
    assert len(run.scalars) == 3
    queried = run.sql("select module, shard, max(rms) m, count(hist) h from stats group by all")
    assert len(queried) == 0


def test_a_shard_is_stored_and_read_back_null_where_the_tensor_was_whole(tmp_path):
    identities = Identities()
    identity = identities.code(Identity("train", "fc", "Linear", Kind.WEIGHT, "weight", 0))
    whole = identities.form_code(Form("float32", (4, 4)))
    shard = identities.form_code(Form("float32", (2, 4), "1/2"))
    chunk = StatsRows(
        step=torch.tensor([0, 1]),
        identity=torch.tensor([identity, identity]),
        form=torch.tensor([whole, shard]),
        identities=identities,
        rank=0,
        stats={"numel": torch.tensor([16, 8]), "mean": torch.tensor([0.5, 0.25])},
    )
    info = RunInfo(
        id="shards",
        name="shards",
        started=time.time(),
        place=ProcessRank(),
        config={"stats": ["mean"], "custom_stats": []},
        modules=[],
        histogram_edges=None,
    )
    store = ParquetStore(tmp_path / "r")
    store.start(info)
    store.write(Records(stats=chunk))
    store.close(RunSummary("finished", time.time(), 2, 2, 0, 0))
    run = layerscope.load(tmp_path / "r")
    assert run.stats["shard"].tolist() == [None, "1/2"]
    assert run.stats["shape"].tolist() == [(4, 4), (2, 4)]
    assert run.sql("select shard from stats order by step")["shard"].tolist()[1] == "1/2"


def test_a_script_that_queried_a_run_exits_without_a_leak_report(tmp_path):
    # A Run kept alive to the end (here by a thread) keeps its DuckDB connection; at exit
    # DuckDB's bindings report every object still alive as leaked.
    script = textwrap.dedent(
        """
        import sys, threading, time, torch, layerscope
        model = torch.nn.Linear(3, 3)
        with layerscope.watch(model, every=1, run=sys.argv[1]) as scope:
            model(torch.randn(2, 3)).sum().backward()
            scope.step(loss=1.0)
        run = layerscope.load(sys.argv[1])
        print(run.sql("select count(*) n from stats").n.item())
        threading.Thread(target=lambda: (run, time.sleep(60)), daemon=True).start()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "6"
    assert "leaked" not in done.stderr, done.stderr


def test_queries_reuse_the_views_until_the_run_has_new_files(tmp_path, monkeypatch):
    from layerscope.store import _sql

    made = []
    original = _sql.create_view
    monkeypatch.setattr(
        _sql, "create_view", lambda *args: (made.append(args[1]), original(*args))[1]
    )
    model = torch.nn.Linear(3, 2)
    with layerscope.watch(model, run=tmp_path / "run", every=1, alerts=False) as scope:
        model(torch.randn(4, 3)).sum().backward()
        scope.step(loss=1.0)
        scope.flush()
        run = layerscope.load(tmp_path / "run")
        first = run.sql("select count(*) as n from stats")["n"][0]
        views = len(made)
        assert views > 0
        assert run.sql("select count(*) as n from stats")["n"][0] == first
        assert len(made) == views  # nothing new on disk: the same views
        model(torch.randn(4, 3)).sum().backward()
        scope.step(loss=2.0)
        scope.flush()
        assert run.sql("select count(*) as n from stats")["n"][0] == 2 * first
        assert len(made) > views  # a new segment: views made again
    assert run.sql("select max(step) as s from scalars")["s"][0] == 1
