"""Links inside a served run that lead out of the served folder are not followed."""

import pytest
from starlette.testclient import TestClient
from ui_runs import record

from layerscope.ui._app import create_app

# The reader warns of each file it leaves out; the answers are what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore::layerscope.LayerscopeWarning")
OUTSIDE = "a link to a place outside the served folder: not read"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``root/linked``: a run whose last stats file and a rank's folder link outside ``root``;
    ``root/borrowed``: a run whose run.json links outside; a secret run beside ``root``."""
    base = tmp_path_factory.mktemp("links")
    secret = record(base / "secret", 3, seed=1)
    root = base / "root"
    linked = root / "linked"
    record(linked, 3)
    stats = sorted((linked / "stats").glob("*.parquet"))[-1]
    stats.unlink()
    stats.symlink_to(sorted((secret / "stats").glob("*.parquet"))[-1])
    (linked / "rank-00001").symlink_to(secret, target_is_directory=True)
    borrowed = root / "borrowed"
    record(borrowed, 2)
    (borrowed / "run.json").unlink()
    (borrowed / "run.json").symlink_to(secret / "run.json")
    return root, stats


def client_of(root):
    return TestClient(create_app(root), base_url="http://127.0.0.1")


def test_a_linked_stats_file_and_rank_folder_are_left_out_and_named(served):
    root, stats = served
    client = client_of(root)
    answer = client.get("/api/runs/linked/heatmap", params={"stat": "absmax"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["steps"] == []  # its only stats file was the link: nothing read from it
    skipped = {item["file"]: item["reason"] for item in body["skipped"]}
    assert skipped["linked/stats/" + stats.name] == OUTSIDE
    assert skipped["linked/rank-00001/run.json"] == OUTSIDE
    assert "secret" not in answer.text


def test_a_linked_run_json_is_refused_by_name(served):
    root, _ = served
    client = client_of(root)
    answer = client.get("/api/runs/borrowed")
    assert answer.status_code == 422
    assert answer.json()["file"] == "borrowed/run.json"
    assert "outside the served folder" in answer.json()["error"]
    listed = {run["id"]: run for run in client.get("/api/runs").json()["runs"]}
    assert listed["borrowed"]["status"] == "unreadable"
    assert listed["borrowed"]["name"] == "borrowed"  # not the secret run's name
