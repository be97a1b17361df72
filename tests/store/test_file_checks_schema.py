"""run.json and modules.json checked field by field for type and range, and one run that
cannot be read is its own row of the listing, never the listing's failure.

Every field's wrong values are tried in ``tests/damage/test_generated_cases.py``; here, the
values that took a whole folder's listing down.
"""

import json
import math
import os
import socket
import time

import pytest

import layerscope
from layerscope.cli import main
from layerscope.store import RunFileError
from layerscope.store._file_checks import check_run_meta, nested_deeper, parse_json
from layerscope.store._file_schema import LATEST_TIME, MAX_NESTING
from layerscope.store._status import combine_metas

pytest.importorskip("duckdb")

GOOD = {"schema": 1, "status": "finished", "steps": 3, "started": 1.7e9, "ended": 1.7e9 + 60}
NESTED = b"[" * 100_000 + b"]" * 100_000
LOG2_EDGES = [0.0, *(2.0 ** (k - 127) for k in range(1, 255)), math.inf]
# Each made runs() and `layerscope runs` fail for the whole folder, and /api/runs answer 500.
DAMAGED = {
    "started-infinite": ({"started": math.inf}, "started"),
    "started-1e300": ({"started": 1e300}, "started"),
    "steps-2-63": ({"steps": 2**63}, "steps"),
    "steps-10-400": ({"steps": 10**400}, "steps"),
    "pid-2-64": ({"status": "running", "pid": 2**64}, "pid"),
    "stats-objects": ({"config": {"stats": [{"x": 1}]}}, "config.stats[0]"),
    "stats-lists": ({"config": {"stats": [["mean"]]}}, "config.stats[0]"),
    "edges-infinite": (
        {"config": {"histogram": {"kind": "log2"}}, "histogram_edges": [math.inf] * 256},
        "histogram_edges",
    ),
    "config-null": ({"config": None}, "config"),
    "rank-not-below-world-size": ({"rank": 1, "world_size": 1}, "rank"),
}


def _write(folder, name, meta=None, payload=None):
    (folder / name).mkdir(parents=True)
    text = payload if payload is not None else json.dumps({**GOOD, "name": name, **meta}).encode()
    (folder / name / "run.json").write_bytes(text)


@pytest.fixture
def folder(tmp_path):
    """A good run, a run.json nested 100,000 levels, and a run for each of ``DAMAGED``."""
    _write(tmp_path, "good", {"host": socket.gethostname(), "pid": os.getpid()})
    _write(tmp_path, "nested", payload=NESTED)
    for name, (fields, _) in DAMAGED.items():
        _write(tmp_path, name, {"host": socket.gethostname(), "updated": time.time(), **fields})
    return tmp_path


def test_a_file_nested_100000_levels_deep_is_refused_by_name():
    with pytest.raises(RunFileError, match=f"nested more than {MAX_NESTING} levels deep"):
        parse_json("runs/a/run.json", NESTED)
    deep = b'{"a": ' * MAX_NESTING + b"1" + b"}" * MAX_NESTING
    assert not nested_deeper(deep, MAX_NESTING)
    assert nested_deeper(b"[" + deep + b"]", MAX_NESTING)
    assert not nested_deeper(b'["' + b"[" * 100 + b'"]', 2)  # brackets in a string


@pytest.mark.parametrize("name", DAMAGED)
def test_a_field_out_of_its_range_is_named(name):
    fields, named = DAMAGED[name]
    with pytest.raises(RunFileError) as raised:
        check_run_meta("runs/a/run.json", {**GOOD, **fields})
    assert raised.value.field == named


def test_the_extremes_of_times_and_counts_are_taken():
    meta = {**GOOD, "started": 0, "ended": LATEST_TIME, "steps": 2**63 - 1, "pid": 2**32 - 1}
    assert check_run_meta("runs/a/run.json", meta) == meta
    edges = {"config": {"histogram": {"kind": "log2"}}, "histogram_edges": LOG2_EDGES}
    assert check_run_meta("runs/a/run.json", {**GOOD, **edges})["histogram_edges"] == LOG2_EDGES


def test_the_liveness_check_asks_about_no_pid_past_pid_t():
    here = {"status": "running", "host": socket.gethostname(), "updated": time.time()}
    assert combine_metas({0: {**here, "pid": 2**31}})["status"] == "running"
    assert combine_metas({0: {**here, "pid": os.getpid()}})["status"] == "running"


def test_each_damaged_run_is_its_own_unreadable_row(folder, capsys):
    listed = layerscope.runs(folder).set_index("name")
    assert listed.loc["good", "status"] == "finished"
    assert listed.loc["good", "steps"] == 3
    assert "nested more than" in listed.loc["nested", "error"]
    for name, (_, named) in DAMAGED.items():
        assert listed.loc[name, "status"] == "unreadable", name
        assert f"{name}/run.json: {named}: " in listed.loc[name, "error"], name

    assert main(["runs", str(folder), "--plain"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}/run.json: " in out for name in DAMAGED)


def test_the_dashboard_lists_each_damaged_run_and_answers_422_for_it(folder):
    from starlette.testclient import TestClient

    from layerscope.ui._app import create_app

    (folder / "good" / "modules.json").write_bytes(NESTED)
    with TestClient(create_app(folder), base_url="http://127.0.0.1") as client:
        answer = client.get("/api/runs")
        assert answer.status_code == 200
        entries = {entry["id"]: entry for entry in answer.json()["runs"]}
        assert entries["good"]["status"] == "finished"
        assert all(entries[name]["status"] == "unreadable" for name in DAMAGED)
        for name in ("started-infinite", "stats-objects", "edges-infinite", "pid-2-64"):
            assert client.get(f"/api/runs/{name}").status_code == 422, name
        modules = client.get("/api/runs/good/modules")
        assert modules.status_code == 422
        assert modules.json()["error"].startswith("good/modules.json: nested more than")


def test_an_unexpected_error_in_one_run_is_its_row_and_its_422(folder, monkeypatch):
    from starlette.testclient import TestClient

    from layerscope.store import _reader
    from layerscope.ui._app import create_app

    def broken(metas):
        if any(meta.get("name") == "good" for meta in metas.values()):
            raise RuntimeError("a reader's bug")
        return combine_metas(metas)

    _write(folder, "other", {})
    monkeypatch.setattr(_reader, "combine_metas", broken)
    listed = layerscope.runs(folder).set_index("name")
    assert listed.loc["good", "status"] == "unreadable"
    assert "RuntimeError: a reader's bug" in listed.loc["good", "error"]
    assert listed.loc["other", "status"] == "finished"
    with TestClient(create_app(folder), base_url="http://127.0.0.1") as client:
        entries = {entry["id"]: entry for entry in client.get("/api/runs").json()["runs"]}
        assert entries["good"]["status"] == "unreadable"
        assert entries["other"]["status"] == "finished"
        answer = client.get("/api/runs/good")
        assert answer.status_code == 422
        assert answer.json()["error"] == "good: cannot be read: RuntimeError: a reader's bug"
