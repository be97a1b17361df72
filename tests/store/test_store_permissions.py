"""Runs this user may not read all of: the rest is read, what is left out is named, no traceback.

Read as another user than root (``nobody``): a process that starts as root, reads a healthy run
once (so every module a reader imports is imported) and then takes nobody's ids. The runs are
world-readable but for the part under test. Skipped where this process is not root (it could
not change user, and a root reader is never refused).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope
from layerscope.store import ParquetStore

pytest.importorskip("duckdb")
pytest.importorskip("starlette")
pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root, to read as another user (root is never refused a file)",
)

NOBODY = 65534
GUARD_SECONDS = 60
# Each run the reader is given: the part of it this user may not read.
CLOSED = {
    "rank-closed": "rank-00001",  # a rank's folder
    "stats-closed": "stats",  # rank 0's stats folder
    "json-closed": "run.json",  # the run's own run.json
}

READER = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, warnings
    import layerscope
    from layerscope.cli import main
    from layerscope.ui._app import create_app
    from starlette.testclient import TestClient

    root = sys.argv[1]
    report = {"root": root}

    def attempt(name, read):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                report[name] = {"value": read(), "error": None}
            except Exception as error:
                report[name] = {"value": None, "error": f"{type(error).__name__}: {error}"}
        report[name]["warnings"] = [str(warning.message) for warning in caught]

    def loaded(name):
        run = layerscope.load(f"{root}/{name}")
        return {
            "ranks": sorted({int(rank) for rank in run.stats["rank"]}),
            "scalar_ranks": sorted({int(rank) for rank in run.scalars["rank"]}),
            "stats_rows": len(run.stats),
            "sql_scalars": int(run.sql("select count(*) as n from scalars")["n"][0]),
            "meta_ranks": [entry["rank"] for entry in run.meta["ranks"]],
            "skipped": run.skipped,
        }

    def command(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(argv))
        return {"status": status, "out": out.getvalue(), "err": err.getvalue()}

    def dashboard():
        answers = {}
        with TestClient(create_app(root), base_url="http://127.0.0.1") as client:
            for path in sys.argv[2:]:
                response = client.get(path)
                answers[path] = {"status": response.status_code, "json": response.json()}
        return answers

    loaded("healthy"), command("summary", f"{root}/healthy", "--plain")  # imports all
    os.setgroups([])
    os.setgid(%(nobody)d)
    os.setuid(%(nobody)d)
    for name in %(closed)r:
        attempt(f"load {name}", lambda name=name: loaded(name))
        attempt(f"summary {name}", lambda n=name: command("summary", f"{root}/{n}", "--plain"))
    attempt("runs", lambda: command("runs", root, "--plain"))
    attempt("dashboard", dashboard)
    print(json.dumps(report))
    """
) % {"nobody": NOBODY, "closed": list(CLOSED)}

ROUTES = [
    "/api/runs",
    "/api/runs/json-closed",
    "/api/runs/rank-closed",
    "/api/runs/stats-closed",
    "/api/runs/stats-closed/scalars",
]


def _write(root: Path, rank: int, monkeypatch) -> None:
    with monkeypatch.context() as patch:
        patch.setenv("RANK", str(rank))
        patch.setenv("WORLD_SIZE", "2")
        torch.manual_seed(rank)
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        with layerscope.watch(model, every=1, run=ParquetStore(root, flush_steps=1)) as scope:
            for step in range(2):
                model(torch.randn(2, 4)).sum().backward()
                scope.step(loss=float(step + 10 * rank))


def _open_to_all(folder: Path) -> None:
    for place, _folders, files in os.walk(folder):
        os.chmod(place, 0o755)
        for name in files:
            os.chmod(os.path.join(place, name), 0o644)


@pytest.fixture(scope="module")
def report():
    """What ``nobody`` read of each run (see READER), by reader."""
    folder = Path(tempfile.mkdtemp(prefix="layerscope-permissions-"))
    monkeypatch = pytest.MonkeyPatch()
    try:
        root = folder / "runs"
        for rank in (0, 1):
            _write(root / "healthy", rank, monkeypatch)
        for name in CLOSED:
            shutil.copytree(root / "healthy", root / name)
        (folder / "home").mkdir()
        _open_to_all(folder)
        for name, closed in CLOSED.items():
            os.chmod(root / name / closed, 0)
        done = subprocess.run(
            [sys.executable, "-c", READER, str(root), *ROUTES],
            capture_output=True,
            text=True,
            timeout=GUARD_SECONDS,
            env={**os.environ, "HOME": str(folder / "home")},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        yield json.loads(done.stdout.splitlines()[-1])
    finally:
        monkeypatch.undo()
        shutil.rmtree(folder)


def test_an_unreadable_rank_is_left_out_named_and_the_rest_loads(report):
    read = report["load rank-closed"]
    assert read["error"] is None
    assert read["value"]["ranks"] == [0]
    assert read["value"]["meta_ranks"] == [0]
    assert read["value"]["stats_rows"] > 0
    (skipped,) = [path for path in read["value"]["skipped"] if "rank-00001" in path]
    assert "may not read" in read["value"]["skipped"][skipped]
    assert any("rank-00001" in warning for warning in read["warnings"])
    summary = report["summary rank-closed"]["value"]
    assert summary["status"] == 0
    assert "rank-00001" in summary["err"]
    assert "Traceback" not in summary["err"]


def test_an_unreadable_stats_folder_is_named_and_the_rest_is_read(report):
    read = report["load stats-closed"]
    assert read["error"] is None
    value = read["value"]
    assert value["ranks"] == [1]  # rank 1's stats folder is readable
    assert value["scalar_ranks"] == [0, 1]
    assert value["sql_scalars"] == 4
    (skipped,) = [path for path in value["skipped"] if path.endswith("stats-closed/stats")]
    assert "may not read" in value["skipped"][skipped]
    assert any("stats-closed/stats" in warning for warning in read["warnings"])
    summary = report["summary stats-closed"]["value"]
    assert summary["status"] == 0
    assert "stats-closed/stats" in summary["err"]
    assert "Traceback" not in summary["err"]


def test_a_run_it_may_not_read_is_named_422_not_hidden_as_no_run(report):
    assert report["load json-closed"]["error"].startswith("PermissionError")
    summary = report["summary json-closed"]["value"]
    assert summary["status"] != 0
    assert "json-closed/run.json" in summary["err"]
    assert "Traceback" not in summary["err"]
    listed = report["runs"]["value"]
    assert listed["status"] == 0
    assert all(name in listed["out"] for name in ["healthy", *CLOSED])
    answers = report["dashboard"]["value"]
    closed = answers["/api/runs/json-closed"]
    assert closed["status"] == 422
    assert closed["json"]["file"] == "json-closed/run.json"
    assert "Permission denied" in closed["json"]["error"]
    listed = {entry["id"]: entry for entry in answers["/api/runs"]["json"]["runs"]}
    assert listed["json-closed"]["status"] == "unreadable"
    assert listed["rank-closed"]["status"] == listed["stats-closed"]["status"] == "finished"
    for path in ("/api/runs/rank-closed", "/api/runs/stats-closed"):
        assert answers[path]["status"] == 200
    notes = answers["/api/runs/stats-closed/scalars"]
    assert notes["status"] == 200
    assert {note["file"] for note in notes["json"].get("skipped", [])} >= {"stats-closed/stats"}
    assert report["root"] not in json.dumps(answers)  # no path on the server's disk
