"""A run's files damaged or crafted: a clear error naming file and field, or rows left out
and named; never a traceback from deep inside, rows a run did not record, or a row twice."""

import json
import shutil
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.cli import main
from layerscope.store import ParquetStore, RunFileError


def record(path, steps=4, flush_steps=1):
    """A tiny run with a segment per step (compaction off), and its stats rows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    store = ParquetStore(path, flush_steps=flush_steps)
    store._compact = lambda table: None  # keep one segment per step, as a live run has
    with layerscope.watch(model, optimizer=optimizer, run=store, every=1, alerts=False) as scope:
        for _ in range(steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return path


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return record(tmp_path_factory.mktemp("original") / "run")


@pytest.fixture
def run_dir(original, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(original, copy)
    return copy


def quietly_load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayerscopeWarning)
        run = layerscope.load(path)
        stats = run.stats
    return run, stats


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "the file is empty"),
        (b'{"schema": 1, "status": "fin', "not JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[]", "expected a JSON object, got list"),
        (b"null", "expected a JSON object, got null"),
        (b'"hello"', "expected a JSON object, got string"),
    ],
)
def test_an_unreadable_run_json_is_named(run_dir, payload, reason, capsys):
    (run_dir / "run.json").write_bytes(payload)
    with pytest.raises(RunFileError, match=reason) as raised:
        layerscope.load(run_dir)
    assert raised.value.path == f"{run_dir}/run.json"
    assert main(["summary", str(run_dir), "--plain"]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir}/run.json" in err
    assert reason in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("schema", "abc", "schema"),
        ("started", "yesterday", "started"),
        ("steps", "abc", "steps"),
        ("steps", -1, "steps"),
        ("steps", True, "steps"),
        ("config", "x", "config"),
        ("histogram_edges", [1, 2], "histogram_edges"),
        ("histogram_edges", "edges", "histogram_edges"),
        ("versions", [1, 2], "versions"),
        ("rank", "0 or 1", "rank"),
        ("status", "done", "status"),
    ],
)
def test_a_run_json_field_of_the_wrong_type_is_named(run_dir, field, value, named):
    edit_json(run_dir / "run.json", lambda meta: meta.update({field: value}))
    with pytest.raises(RunFileError, match=f"run.json: {named}: expected") as raised:
        layerscope.load(run_dir)
    assert raised.value.field == named


def test_a_newer_schema_is_refused_by_name(run_dir):
    edit_json(run_dir / "run.json", lambda meta: meta.update(schema=99))
    with pytest.raises(RunFileError, match="newer layerscope"):
        layerscope.load(run_dir)


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        (lambda tree: [{k: v for k, v in tree[0].items() if k != "type"}, *tree[1:]], "[0].type"),
        (lambda tree: [{**tree[0], "parameters": [1]}, *tree[1:]], "[0].parameters"),
        (lambda tree: [1, 2, 3], "[0]"),
        (lambda tree: {}, None),
        (lambda tree: [{**tree[1], "children": "0"}], "[0].children"),
    ],
)
def test_a_modules_json_field_of_the_wrong_type_is_named(run_dir, entries, named):
    tree = json.loads((run_dir / "modules.json").read_text())
    (run_dir / "modules.json").write_text(json.dumps(entries(tree)))
    run = layerscope.load(run_dir)
    with pytest.raises(RunFileError, match=r"modules\.json") as raised:
        _ = run.modules
    assert raised.value.field == named


def test_a_segment_of_other_columns_is_left_out_and_named(run_dir, original):
    segment = sorted((run_dir / "stats").glob("seg-*.parquet"))[1]
    pq.write_table(pa.table({"a": [1, 2]}), segment)
    run, stats = quietly_load(run_dir)
    _, whole = quietly_load(original)
    assert not stats[["step", "module", "kind"]].isna().any().any()  # no row of null keys
    assert len(stats) == len(whole[whole.step != 1])
    assert run.skipped[str(segment)] == "not a stats file of layerscope: no column " + (
        "step, phase, module, kind, tensor, call"
    )


def test_a_segment_whose_step_is_text_is_left_out(run_dir):
    segment = sorted((run_dir / "stats").glob("seg-*.parquet"))[0]
    data = pq.read_table(segment)
    steps = pa.array([str(step) for step in data["step"].to_pylist()])
    pq.write_table(data.set_column(0, "step", steps), segment)
    run, stats = quietly_load(run_dir)
    assert "column step is string, expected integer" in run.skipped[str(segment)]
    assert 0 not in set(stats.step)


@pytest.mark.parametrize("copy_name", ["seg-000099.parquet", "data-000050-000060.parquet"])
def test_a_segment_copied_under_a_second_name_is_read_once(run_dir, original, copy_name):
    segment = sorted((run_dir / "stats").glob("seg-*.parquet"))[0]
    shutil.copy(segment, run_dir / "stats" / copy_name)
    run, stats = quietly_load(run_dir)
    _, whole = quietly_load(original)
    assert len(stats) == len(whole)
    assert not stats.duplicated(["step", "module", "kind", "tensor", "call"]).any()
    assert run.skipped == {
        str(run_dir / "stats" / copy_name): f"a copy of {segment.name}: written under that name"
    }
    counted = run.sql("select count(*) as n from stats").n.item()
    assert counted == len(whole)


def test_a_copy_of_a_file_without_its_name_inside_is_known_by_its_footer(run_dir):
    """Files written before they carried their name: a byte-for-byte copy is read once."""
    for segment in sorted((run_dir / "stats").glob("seg-*.parquet")):
        data = pq.read_table(segment)
        metadata = {k: v for k, v in data.schema.metadata.items() if k != b"layerscope.file"}
        pq.write_table(data.replace_schema_metadata(metadata), segment)
    first = sorted((run_dir / "stats").glob("seg-*.parquet"))[0]
    shutil.copy(first, run_dir / "stats" / "seg-000099.parquet")
    run, stats = quietly_load(run_dir)
    assert run.skipped == {
        str(run_dir / "stats" / "seg-000099.parquet"): f"a copy of {first}: the same rows twice"
    }
    assert not stats.duplicated(["step", "module", "kind", "tensor", "call"]).any()


def test_another_ranks_rows_in_a_rank_directory_are_left_out(run_dir):
    rank_dir = run_dir / "rank-00001"
    rank_dir.mkdir()
    for name in ("run.json", "modules.json", "stats"):
        source = run_dir / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, rank_dir / name)
    edit_json(rank_dir / "run.json", lambda meta: meta.update(rank=1, world_size=2))
    run, stats = quietly_load(run_dir)
    assert set(stats["rank"]) == {0}
    reasons = {path: reason for path, reason in run.skipped.items() if "rank-00001" in path}
    segments = sorted((rank_dir / "stats").glob("seg-*.parquet"))
    assert reasons == {
        **{str(path): "holds rows of rank 0 to 0, not of rank 1" for path in segments},
        str(rank_dir / "stats"): "its files hold 0 rows where run.json counts 56 written: "
        "files were removed or replaced",
    }


@pytest.mark.parametrize("damage", ["emptied", "a file"])
def test_a_table_holding_fewer_rows_than_written_is_named(run_dir, damage, capsys):
    shutil.rmtree(run_dir / "stats")
    if damage == "emptied":
        (run_dir / "stats").mkdir()
    else:
        (run_dir / "stats").write_text("not a folder")
    run = layerscope.load(run_dir)
    with pytest.warns(LayerscopeWarning) as warned:
        stats = run.stats
    assert stats.empty
    written = json.loads((run_dir / "run.json").read_text())["written_rows"]
    reason = run.skipped[str(run_dir / "stats")]
    if damage == "emptied":
        expected = f"there is no file: it holds 0 rows where run.json counts {written}"
        assert reason.startswith(expected)
    else:
        assert reason == "a file where the stats folder should be"
    assert any(str(run_dir / "stats") in str(w.message) for w in warned)
    # The command says so too, under the table it could not read.
    with warnings.catch_warnings():
        warnings.simplefilter("always", LayerscopeWarning)  # the command shows them in a line
        assert main(["summary", str(run_dir), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "files left out (damaged)" in out
    assert f"{run_dir}/stats" in out


def test_a_compactions_temporary_goes_when_the_run_is_read(run_dir):
    stale = run_dir / "stats" / ".data-000001-000004.parquet.0123abcd.tmp"
    stale.write_bytes(b"x" * 4096)
    users = run_dir / "stats" / ".notes.tmp"  # not a name layerscope makes: left alone
    users.write_text("mine")
    quietly_load(run_dir)
    assert not stale.exists()
    assert users.exists()


def test_a_killed_writers_reserve_goes_when_the_run_is_read(run_dir):
    reserve = run_dir / ".run.json.reserve"
    reserve.write_bytes(b"x" * 65536)

    def crashed(meta):
        meta.update(status="running", ended=None, host="elsewhere.invalid", pid=1)
        meta.update(updated=0.0, heartbeat_seconds=1.0)

    edit_json(run_dir / "run.json", crashed)
    assert layerscope.load(run_dir).meta["status"] == "crashed"
    assert not reserve.exists()


def test_a_running_writers_temporary_is_left_alone(run_dir):
    stale = run_dir / "stats" / ".data-000001-000004.parquet.0123abcd.tmp"
    stale.write_bytes(b"x")
    edit_json(run_dir / "run.json", lambda meta: meta.update(status="running", ended=None))
    quietly_load(run_dir)  # this process's pid, on this host: a writer that lives
    assert stale.exists()


def test_a_killed_runs_summary_says_where_each_table_ends(run_dir, capsys):
    """A writer killed between the files of one flush: statistics to 3, scalars to 2."""
    last = sorted((run_dir / "scalars").glob("seg-*.parquet"))[-1]
    last.unlink()

    def crashed(meta):
        meta.update(status="running", ended=None, host="elsewhere.invalid", pid=1)
        meta.update(updated=0.0, heartbeat_seconds=1.0, written_scalars=3)

    edit_json(run_dir / "run.json", crashed)
    assert main(["summary", str(run_dir), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "tables    stats to step 3, scalars to step 2, alerts none" in out


def test_a_run_is_not_written_among_other_files(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    model = nn.Linear(2, 2)
    with pytest.raises(FileExistsError, match=r"holds files that are not a run's \(notes\.txt\)"):
        layerscope.watch(model, run=folder)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert not model._forward_hooks


def test_a_run_path_that_is_a_file_is_refused_as_such(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("keep")
    with pytest.raises(FileExistsError, match="is a file"):
        layerscope.watch(nn.Linear(2, 2), run=path)
    assert path.read_text() == "keep"


def test_a_new_or_empty_directory_takes_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "new"):
        record(path, steps=1)
        assert layerscope.load(path).meta["status"] == "finished"


@pytest.mark.parametrize("table", ["stats", "scalars"])
def test_a_missing_table_folder_is_named(run_dir, table):
    shutil.rmtree(run_dir / table)
    run = layerscope.load(run_dir)
    with pytest.warns(LayerscopeWarning, match=f"{table}, which cannot be read"):
        assert getattr(run, table).empty
    assert "there is no file: it holds 0 rows" in run.skipped[str(run_dir / table)]


def test_alerts_removed_are_named_by_the_step_run_json_says_they_reach(run_dir):
    edit_json(run_dir / "run.json", lambda meta: meta.update(alerts_last_step=2))
    run = layerscope.load(run_dir)
    with pytest.warns(LayerscopeWarning, match="alerts"):
        assert run.alerts.empty
    reason = run.skipped[str(run_dir / "alerts")]
    assert reason == (
        "there is no file: it holds 0 rows where run.json says they reach step 2: files were "
        "removed or replaced"
    )


def test_a_rank_directory_without_run_json_is_left_out_and_named(run_dir):
    rank_dir = run_dir / "rank-00001"
    shutil.copytree(run_dir / "stats", rank_dir / "stats")
    run = layerscope.load(run_dir)
    with pytest.warns(LayerscopeWarning, match="rank-00001"):
        stats = run.stats
    assert set(stats["rank"]) == {0}
    assert run.skipped == {str(rank_dir): "no run.json there: its files are left out"}
    assert [entry["rank"] for entry in run.meta["ranks"]] == [0]


def test_a_module_listed_twice_is_named(run_dir):
    tree = json.loads((run_dir / "modules.json").read_text())
    (run_dir / "modules.json").write_text(json.dumps(tree + tree[:1]))
    with pytest.raises(RunFileError, match=r"\[4\]\.name: '' is listed twice"):
        _ = layerscope.load(run_dir).modules


@pytest.mark.parametrize("damage", ["garbage", "folder"])
def test_summary_of_a_run_with_damaged_modules_json_names_it_and_shows_the_rest(
    run_dir, damage, capsys
):
    (run_dir / "modules.json").unlink()
    if damage == "garbage":
        (run_dir / "modules.json").write_bytes(b"\xff{")
    else:
        (run_dir / "modules.json").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("always", LayerscopeWarning)
        assert main(["summary", str(run_dir), "--plain"]) == 0
    captured = capsys.readouterr()
    assert f"{run_dir}/modules.json" in captured.err
    assert "Traceback" not in captured.err
    assert "layers (phase train" in captured.out  # the rows are shown all the same
