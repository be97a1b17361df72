"""``layerscope runs`` over a folder with damaged runs: the good ones listed, the others named."""

import json
import shutil

import pytest
from cli_runs import rows_of, tiny_model, train

import layerscope

pytest.importorskip("duckdb")  # the commands query runs with DuckDB

# run.json as a run's cannot be read, and what the reason says (the field where one is to blame).
BAD_RUN_FILES = {
    "list": (b"[]", "run.json: expected a JSON object, got list"),
    "null": (b"null", "run.json: expected a JSON object, got null"),
    "hello": (b'"hello"', "run.json: expected a JSON object, got string"),
    "schema": (b'{"schema": "abc"}', "run.json: schema: expected an integer >= 1"),
    "yesterday": (b'{"started": "yesterday"}', "run.json: started: expected a number"),
    "truncated": (b'{"schema": 1, "na', "run.json: not JSON"),
    "empty": (b"", "run.json: the file is empty"),
    "latin1": (b'{"name": "caf\xe9"}', "run.json: not UTF-8 text"),
}


@pytest.fixture
def runs(tmp_path):
    """``good`` (3 steps), and a copy of it for each damaged run.json."""
    folder = tmp_path / "runs"
    train(tiny_model(), folder / "good", steps=3)
    for name, (payload, _) in BAD_RUN_FILES.items():
        shutil.copytree(folder / "good", folder / name)
        (folder / name / "run.json").write_bytes(payload)
    return folder


def test_the_frame_lists_the_good_run_and_names_each_unreadable_one(runs):
    listed = layerscope.runs(runs).set_index("name")
    assert list(listed.reset_index().columns) == [
        "name", "path", "status", "steps", "ranks", "started", "ended", "error",
    ]  # fmt: skip
    assert sorted(listed.index) == sorted(["good", *BAD_RUN_FILES])
    good = listed.loc["good"]
    assert (good.status, good.steps, good.ranks, good.error) == ("finished", 3, 1, None)
    for name, (_, reason) in BAD_RUN_FILES.items():
        row = listed.loc[name]
        assert row.status == "unreadable"
        assert row.path == str(runs / name)
        assert row.error.startswith(f"{runs / name}/{reason}"), row.error
        assert row.started != row.started  # NaT: nothing was read


def test_the_command_lists_each_unreadable_run_with_its_reason_on_one_line(runs, cli):
    status, out, err = cli("runs", runs, "--plain")
    assert (status, err) == (0, "")
    listed = {row[0]: row for row in rows_of(out, "runs under")}
    assert sorted(listed) == sorted(["good", *BAD_RUN_FILES])
    assert listed["good"][1:4] == ["finished", "3", "1"]
    for name in BAD_RUN_FILES:
        assert listed[name][1:] == ["unreadable", "-", "-", "-", "-"]
    reasons = out.split("unreadable runs\n", 1)[1].splitlines()
    assert len(reasons) == len(BAD_RUN_FILES)  # one line each
    for line in reasons:
        name, reason = line.split(None, 1)
        assert reason.startswith(f"{runs / name}/{BAD_RUN_FILES[name][1]}"), line


def test_a_folder_of_unreadable_runs_only_is_listed_and_the_command_succeeds(tmp_path, cli):
    folder = tmp_path / "runs"
    train(tiny_model(), folder / "a", steps=1)
    meta = json.loads((folder / "a" / "run.json").read_text())
    (folder / "a" / "run.json").write_text(json.dumps({**meta, "steps": -1}))
    status, out, _ = cli("runs", folder, "--plain")
    assert status == 0
    ((name, state, *_),) = rows_of(out, "runs under")
    assert (name, state) == ("a", "unreadable")
    assert "a/run.json: steps: expected an integer >= 0, got number -1" in out


def test_a_folder_of_a_run_that_lost_its_run_json_is_listed_as_such(tmp_path, cli):
    folder = tmp_path / "runs"
    train(tiny_model(), folder / "lost", steps=1)
    (folder / "lost" / "run.json").unlink()
    (folder / "notes").mkdir()  # no run's file: not listed
    (folder / "notes" / "todo.txt").write_text("not a run")
    listed = layerscope.runs(folder)
    assert listed.name.tolist() == ["lost"]
    assert listed.error[0] == f"{folder / 'lost'}/run.json: missing, though the folder holds " + (
        "a run's other files"
    )
    status, out, _ = cli("runs", folder, "--plain")
    assert status == 0
    assert [row[:2] for row in rows_of(out, "runs under")] == [["lost", "unreadable"]]
