"""Damaged runs in the dashboard: listed and named, every route a JSON answer, gaps shown.

A folder holds good runs beside copies of one whose files were damaged: run.json as anything
but a run's, modules.json with wrong fields, a segment replaced by garbage, a rank's run.json
broken. None may hide the good runs, make a route fail unanswered, or leak the server's paths.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from ui_runs import Server, record

import layerscope
from layerscope.ui import _catalog, _overview
from layerscope.ui._app import CONTENT_SECURITY_POLICY, create_app

testclient = pytest.importorskip("starlette.testclient")
# The reader warns of each file it leaves out; here that is what is tested, in the answers.
pytestmark = pytest.mark.filterwarnings("ignore::layerscope.LayerscopeWarning")

ROUTES = [
    "",
    "/modules",
    "/scalars",
    "/alerts",
    "/heatmap",
    "/series?module=0",
    "/colordim?module=0",
    "/distribution?module=0&step=1",
]
READ_WITHOUT_MODULES = ("", "/scalars", "/alerts")
# run.json as a run's cannot be read, and the field to blame (None: the whole file).
BAD_RUN_FILES = {
    "list": (b"[]", None),
    "null": (b"null", None),
    "hello": (b'"hello"', None),
    "schema": (b'{"schema": "abc"}', "schema"),
    "yesterday": (b'{"started": "yesterday"}', "started"),
    "truncated": (b'{"schema": 1, "name": "trun', None),
    "empty": (b"", None),
    "latin1": (b'{"name": "caf\xe9"}', None),
}
# modules.json's second entry damaged, and the field to blame.
BAD_MODULES = {
    "no-type": (lambda entry: entry.pop("type"), "[1].type"),
    "bad-shapes": (lambda entry: entry.update(parameters=[1]), "[1].parameters"),
}
GOOD = ["alerting", "good"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """``good`` and ``alerting`` (a NaN at step 1: one alert), and damaged copies of ``good``."""
    folder = tmp_path_factory.mktemp("damaged") / "runs"
    record(folder / "good", 4)
    record(folder / "alerting", 4, nan_at=1)
    for name, (payload, _) in BAD_RUN_FILES.items():
        damaged = _copy(folder, name)
        (damaged / "run.json").write_bytes(payload)
    for name, (damage, _) in BAD_MODULES.items():
        damaged = _copy(folder, name)
        entries = json.loads((damaged / "modules.json").read_text())
        damage(entries[1])
        (damaged / "modules.json").write_text(json.dumps(entries))
    garbage = _copy(folder, "garbage")
    (garbage / "stats" / "seg-000001.parquet").write_bytes(b"PAR1 not a parquet file at all")
    ranked = _copy(folder, "bad-rank")
    (ranked / "rank-00001").mkdir()
    (ranked / "rank-00001" / "run.json").write_text('{"rank": "one"}')
    (_copy(folder, "lost") / "run.json").unlink()  # a run's other files, no run.json
    shutil.copytree(folder / "alerting", folder / "bad-alerts")
    (folder / "bad-alerts" / "alerts" / "seg-000001.parquet").write_bytes(b"garbage")
    (folder / "notes").mkdir()  # no run's file: not a run
    (folder / "notes" / "todo.txt").write_text("not a run")
    return folder


def _copy(folder: Path, name: str) -> Path:
    shutil.copytree(folder / "good", folder / name)
    return folder / name


@pytest.fixture(scope="module")
def client(root):
    with testclient.TestClient(create_app(root), base_url="http://127.0.0.1") as opened:
        yield opened


def _no_server_path(body: bytes, root: Path) -> None:
    assert str(root).encode() not in body
    assert str(root.resolve()).encode() not in body


def test_the_folder_lists_the_good_runs_and_names_each_unreadable_one(client, root):
    response = client.get("/api/runs")
    assert response.status_code == 200
    _no_server_path(response.content, root)
    listed = {entry["id"]: entry for entry in response.json()["runs"]}
    readable = [*GOOD, *BAD_MODULES, "garbage", "bad-rank", "bad-alerts"]
    assert sorted(listed) == sorted([*readable, *BAD_RUN_FILES, "lost"])
    for name in readable:
        run = layerscope.load(root / name)
        assert listed[name]["status"] == run.meta["status"] == "finished"
        assert listed[name]["steps"] == 4
        assert listed[name]["error"] is None
    assert listed["alerting"]["alerts"] == 1
    assert listed["good"]["alerts"] == 0
    for name, (_, field) in BAD_RUN_FILES.items():
        entry = listed[name]
        assert entry["status"] == "unreadable"
        assert entry["steps"] is entry["alerts"] is entry["started"] is None
        assert entry["error"].startswith(f"{name}/run.json: " + (f"{field}: " if field else ""))
    assert listed["lost"]["status"] == "unreadable"
    assert listed["lost"]["error"].startswith("lost/run.json: missing")
    # Counts read without a file say so: alerting's alert is in the garbage.
    assert listed["bad-alerts"]["alerts"] == 0
    skipped = {entry["file"] for entry in listed["bad-alerts"]["skipped"]}
    assert "bad-alerts/alerts/seg-000001.parquet" in skipped
    assert "skipped" not in listed["good"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_run_that_lost_its_run_json_is_422_naming_it_and_a_plain_folder_404(client, route):
    response = client.get(f"/api/runs/lost{route}")
    assert response.status_code == 422
    assert response.json()["file"] == "lost/run.json"
    assert response.json()["error"].startswith("lost/run.json: missing")
    assert client.get(f"/api/runs/notes{route}").status_code == 404


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(BAD_RUN_FILES))
def test_a_damaged_run_json_is_422_on_every_route_naming_the_file_and_field(
    client, root, name, route
):
    response = client.get(f"/api/runs/{name}{route}")
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    _no_server_path(response.content, root)
    answer = response.json()
    field = BAD_RUN_FILES[name][1]
    assert answer["file"] == f"{name}/run.json"
    assert answer["field"] == field
    assert answer["error"].startswith(f"{name}/run.json: " + (f"{field}: " if field else ""))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(BAD_MODULES))
def test_a_damaged_modules_json_is_422_where_the_tree_is_read(client, root, name, route):
    response = client.get(f"/api/runs/{name}{route}")
    if route in READ_WITHOUT_MODULES:
        assert response.status_code == 200
        return
    assert response.status_code == 422, response.text
    _no_server_path(response.content, root)
    answer = response.json()
    assert answer["file"] == f"{name}/modules.json"
    assert answer["field"] == BAD_MODULES[name][1]
    assert answer["error"].startswith(f"{name}/modules.json: {BAD_MODULES[name][1]}: ")


@pytest.mark.parametrize("route", [route for route in ROUTES if route != "/modules"])
def test_an_answer_read_without_a_damaged_segment_names_it(client, root, route):
    # (The module tree reads no table: its answer names what was left out before, if any.)
    response = client.get(f"/api/runs/garbage{route}")
    assert response.status_code == 200, response.text
    _no_server_path(response.content, root)
    skipped = {entry["file"]: entry["reason"] for entry in response.json()["skipped"]}
    assert "Parquet" in skipped["garbage/stats/seg-000001.parquet"]
    assert "run.json counts" in skipped["garbage/stats"]  # the rows that went with it
    assert "skipped" not in client.get(f"/api/runs/good{route}").json()


def test_a_rank_whose_run_json_is_damaged_is_named_and_the_run_shown(client):
    answer = client.get("/api/runs/bad-rank").json()
    assert answer["ranks"] == [0]
    (entry,) = answer["skipped"]
    assert entry["file"] == "bad-rank/rank-00001/run.json"
    assert entry["reason"].startswith("rank: expected an integer")


def test_an_unexpected_error_is_a_json_500_with_the_security_headers(client, monkeypatch):
    def broken(run):
        raise RuntimeError(f"a bug that names {run.path}")

    monkeypatch.setattr(_overview, "modules", broken)
    response = client.get("/api/runs/good/modules")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error"}
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"


def test_a_file_that_passes_the_checks_but_not_a_read_is_422_naming_it(client, root, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    damaged = root.resolve() / "good" / "scalars" / "seg-000001.parquet"

    def unreadable(self, query, params=None):
        raise duckdb.IOException(f'IO Error: Could not read enough bytes from file "{damaged}"')

    monkeypatch.setattr(layerscope.store.Run, "sql", unreadable)
    response = client.get("/api/runs/good/scalars")
    assert response.status_code == 422
    _no_server_path(response.content, root)
    answer = response.json()
    assert answer["file"] == "good/scalars/seg-000001.parquet"
    assert answer["error"].startswith("a file of the run cannot be read: IO Error")


def test_no_such_run_is_still_404(client):
    response = client.get("/api/runs/nothing-here/heatmap")
    assert response.status_code == 404
    assert response.json() == {"error": "no such run"}


# ---------------------------------------------------------------------- the listing's cache


@pytest.fixture
def small_root(tmp_path, root):
    """A folder of its own: ``good`` and ``alerting``, copied."""
    folder = tmp_path / "runs"
    for name in GOOD:
        shutil.copytree(root / name, folder / name)
    return folder


@pytest.fixture
def counted_reads(monkeypatch):
    """How many times the listing read a run's run.json."""
    reads: list[str] = []
    read = _catalog.run_row

    def counting(location, name, **options):
        reads.append(name)
        return read(location, name, **options)

    monkeypatch.setattr(_catalog, "run_row", counting)
    return reads


def test_an_unchanged_run_is_listed_from_the_cache(small_root, counted_reads):
    with testclient.TestClient(create_app(small_root), base_url="http://127.0.0.1") as client:
        first = client.get("/api/runs").json()
        assert sorted(counted_reads) == GOOD
        assert client.get("/api/runs").json() == first
        assert sorted(counted_reads) == GOOD  # not read again


def test_a_rewritten_run_json_or_alerts_folder_is_read_again(small_root, counted_reads):
    with testclient.TestClient(create_app(small_root), base_url="http://127.0.0.1") as client:
        before = {entry["id"]: entry for entry in client.get("/api/runs").json()["runs"]}
        assert before["good"]["name"] == "good"
        assert before["alerting"]["alerts"] == 1
        run_json = small_root / "good" / "run.json"
        meta = json.loads(run_json.read_text())
        run_json.write_text(json.dumps({**meta, "name": "renamed"}))
        later = time.time() + 10
        os.utime(run_json, (later, later))
        for segment in (small_root / "alerting" / "alerts").iterdir():
            segment.unlink()
        after = {entry["id"]: entry for entry in client.get("/api/runs").json()["runs"]}
    assert after["good"]["name"] == "renamed"
    assert after["alerting"]["alerts"] == 0
    assert sorted(counted_reads) == ["alerting", "good", "good"]  # alerting's run.json kept


def test_a_run_marked_running_is_read_again_each_time(small_root, counted_reads):
    # Its status may turn to crashed with time alone, its files unchanged.
    run_json = small_root / "good" / "run.json"
    meta = json.loads(run_json.read_text())
    meta.update(status="running", ended=None, pid=os.getpid(), updated=time.time())
    run_json.write_text(json.dumps(meta))
    with testclient.TestClient(create_app(small_root), base_url="http://127.0.0.1") as client:
        for _ in range(3):
            listed = {entry["id"]: entry for entry in client.get("/api/runs").json()["runs"]}
            assert listed["good"]["status"] == "running"
    assert counted_reads.count("good") == 3
    assert counted_reads.count("alerting") == 1


def test_a_removed_run_leaves_the_listing(small_root):
    with testclient.TestClient(create_app(small_root), base_url="http://127.0.0.1") as client:
        assert len(client.get("/api/runs").json()["runs"]) == 2
        shutil.rmtree(small_root / "good")
        assert [entry["id"] for entry in client.get("/api/runs").json()["runs"]] == ["alerting"]


def test_threads_listing_at_once_get_the_same_answer(root):
    catalog = _catalog.RunCatalog(root)
    answers: list[list[dict]] = []
    threads = [threading.Thread(target=lambda: answers.append(catalog.listing())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = catalog.listing()
    assert len(answers) == 8
    assert all(answer == expected for answer in answers)


# ---------------------------------------------------------------------- the page


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright")
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip(f"needs Debian's chromium at {chromium}")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == []


def test_the_page_marks_unreadable_runs_with_their_reason_and_no_link(page, root):
    with Server(root) as server:
        page.goto(server.url + "/")
        page.wait_for_selector("#runs-table tbody tr")
        rows = page.locator("#runs-table tr.unreadable")
        assert rows.count() == len(BAD_RUN_FILES) + 1  # lost
        assert rows.locator("a").count() == 0
        row = page.locator("#runs-table tr.unreadable", has_text="yesterday")
        assert row.locator(".status").inner_text() == "unreadable"
        assert "yesterday/run.json: started: expected a number" in row.inner_text()
        links = page.locator("#runs-table a")
        readable = len(GOOD) + len(BAD_MODULES) + 3  # garbage, bad-rank, bad-alerts
        assert links.count() == readable
        assert all(
            links.nth(i).get_attribute("href").removeprefix("#/run/") not in BAD_RUN_FILES
            for i in range(readable)
        )
        partial = page.locator("#runs-table tr", has=page.locator(".partial"))
        assert partial.count() == 2  # bad-alerts, bad-rank
        title = partial.locator(".partial").first.get_attribute("title")
        assert "bad-alerts/alerts/seg-000001.parquet" in title


def test_the_page_shows_which_file_a_run_was_read_without(page, root):
    with Server(root) as server:
        page.goto(server.url + "/#/run/garbage")
        notice = page.locator("#skipped")
        notice.wait_for(state="visible", timeout=15_000)
        text = notice.inner_text()
        assert "garbage/stats/seg-000001.parquet" in text
        assert "Parquet" in text
        page.goto(server.url + "/#/run/good")
        page.wait_for_selector("#run-steps")
        assert not page.locator("#skipped").is_visible()
