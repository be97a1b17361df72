"""No name from a run's files becomes SQL: a column named as a statement is left out, or data.

A Parquet file may name its columns anything. Each table's file of a small real run (stats,
scalars, alerts, attention, calls) is written again with a column named as DuckDB statements:
pasted into a query, the name ends it, writes ``INJECTED_<table>.csv`` into the working
directory and reads a secret file into a key column (as ``read_csv('/etc/passwd')`` would).
Every reader then reads the copy: ``load()``'s tables, ``run.sql``, ``layerscope.precision``,
``run.plot``, the command and the dashboard's routes. No canary may appear, nor the secret in
any output; each reader reads the run as it reads the original (the planted column ignored),
or names the file it left out.
"""

from __future__ import annotations

import io
import shutil
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.fixtures.every_table_run import record

import layerscope
from layerscope.cli import main
from layerscope.model import quote_identifier
from layerscope.stats import FORMAT_NAMES

pytest.importorskip("starlette")
pytest.importorskip("matplotlib")
from matplotlib.text import Text
from starlette.testclient import TestClient

from layerscope.ui._app import create_app

SECRET = "secret-3f9c1d"  # the secret file's content: it must never come back
TABLES = ("stats", "scalars", "alerts", "attention", "calls")
# Per table, the column the secret is read into: one every reader shows.
SHOWN_KEY = {
    "stats": "module",
    "scalars": "name",
    "alerts": "message",
    "attention": "module",
    "calls": "module",
}
RUN = object()  # in a command's arguments: the run read, the planted one or its original
ROUTES = ("modules", "scalars", "alerts", "heatmap", "series", "colordim", "distribution")


def table_files(run):
    """Each table and its one file (a finished run's tables are compacted to one each)."""
    for table in TABLES:
        if table == "calls":
            yield table, run / "calls.parquet"
        else:
            (path,) = (run / table).glob("*.parquet")
            yield table, path


def write_columns(path, names, data):
    """``data``'s columns under ``names``, its footer's metadata (the file's name) kept."""
    table = pa.table(data, names=names).replace_schema_metadata(pq.read_schema(path).metadata)
    pq.write_table(table, path)


def breakout(table, column, label, secret):
    """A name that, pasted into a query as ``"name"``, ends it, writes ``INJECTED_<label>.csv``
    and selects the table with the secret file's lines in its shown key column."""
    key = SHOWN_KEY[table]
    read = f"(select string_agg(column0, ' ') from read_csv('{secret}', header = false))"
    return (
        f"{column}\" from {table}; copy (select 42) to 'INJECTED_{label}.csv'; "
        f'select {read} as "{key}", * exclude ("{key}") from {table} --'
    )


def plant_columns(run, secret):
    """One more column first in each table's file, named as a statement."""
    for table, path in table_files(run):
        data = pq.read_table(path)
        name = breakout(table, data.column_names[0], table, secret)
        names = [name, *data.column_names]
        write_columns(path, names, [pa.array([1] * data.num_rows), *data.columns])


def rename_columns(run, secret):
    """Every column renamed to a statement, each its own: no column a reader knows is left."""
    for table, path in table_files(run):
        data = pq.read_table(path)
        names = [
            breakout(table, name, f"{table}_{index}", secret)
            for index, name in enumerate(data.column_names)
        ]
        write_columns(path, names, data.columns)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("identifiers")
    secret = root / "secret.txt"
    secret.write_text(f"{SECRET}\n{SECRET}\n")
    return record(root / "runs" / "base"), secret


def planted_copy(recorded, tmp_path, plant):
    base, secret = recorded
    run = tmp_path / "runs" / "planted"
    shutil.copytree(base, run)
    plant(run, secret)
    return run


def run_command(argv):
    """The command's status and everything it printed."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", err)
        status = main([str(arg) for arg in argv])
    return status, out.getvalue() + err.getvalue()


def dashboard_answers(root, name):
    """Every route of the run, as a browser on this machine asks."""
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    answers = {"run": client.get(f"/api/runs/{name}")}
    query = {"module": "mlp.0", "kind": "activation", "step": 0}
    for route in ROUTES:
        answers[route] = client.get(f"/api/runs/{name}/{route}", params=query)
    answers["attention"] = client.get(f"/api/runs/{name}/attention")
    return answers


def figures(run):
    """run.plot's figures that read each table by SQL, drawn with no file written."""
    return [
        run.plot.heatmap("absmax", kind="weight"),
        run.plot.attention(),
        run.plot.scalars(),
    ]


def assert_no_canary(tmp_path, run, outputs):
    written = [*tmp_path.rglob("INJECTED*"), *run.parent.parent.rglob("INJECTED*")]
    assert not written
    assert not [text for text in outputs if SECRET in text]


def test_columns_named_as_statements_are_left_out_of_every_query(recorded, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a planted ``copy ... to`` would write its canary
    base = recorded[0]
    run_dir = planted_copy(recorded, tmp_path, plant_columns)
    run, original = layerscope.load(run_dir), layerscope.load(base)
    outputs = []
    for table in TABLES:
        frame = getattr(run, table)
        outputs.append(frame.to_string())
        assert len(frame) == len(getattr(original, table)) > 0, table
        queried = run.sql(f"select * from {quote_identifier(table)}")
        outputs.append(queried.to_string())
        assert len(queried) == len(frame), table
    for fmt in FORMAT_NAMES:
        frame = layerscope.precision(run, fmt)
        outputs.append(frame.to_string())
        assert frame.equals(layerscope.precision(original, fmt)), fmt
    for fig in figures(run):
        outputs += [text.get_text() for text in fig.findobj(Text)]
    for argv in (
        ["summary", RUN, "--plain", "--alerts", "0"],
        ["summary", RUN, "--plain", "--kind", "weight", "--kind", "grad"],
        ["diff", RUN, base, "--plain"],
        ["runs", run_dir.parent, "--plain"],
    ):
        status, printed = run_command([run_dir if arg is RUN else arg for arg in argv])
        outputs.append(printed)
        assert status == 0, printed
        assert "skipped" not in printed, printed
        if argv[0] == "summary":  # as the original's, its path aside
            original = run_command([base if arg is RUN else arg for arg in argv])[1]
            assert printed.replace(str(run_dir), "RUN") == original.replace(str(base), "RUN")
    answers = dashboard_answers(run_dir.parent, "planted")
    originals = dashboard_answers(base.parent, "base")
    for route, answer in answers.items():
        outputs.append(answer.text)
        assert answer.status_code == 200, (route, answer.text)
        planted, expected = answer.json(), originals[route].json()
        if route == "run":  # each run's id is its folder's name
            assert (planted.pop("id"), expected.pop("id")) == ("planted", "base")
        assert planted == expected, route
    assert_no_canary(tmp_path, run_dir, outputs)


def test_a_file_whose_every_column_is_a_statement_is_named_and_left_out(
    recorded, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    run_dir = planted_copy(recorded, tmp_path, rename_columns)
    outputs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # each file left out is named by a warning
        run = layerscope.load(run_dir)
        for table in TABLES:
            assert getattr(run, table).empty, table
            assert run.sql(f"select count(*) as n from {quote_identifier(table)}").n.item() == 0
        for fmt in FORMAT_NAMES:
            assert layerscope.precision(run, fmt).empty
        for argv in (["summary", run_dir, "--plain"], ["runs", run_dir.parent, "--plain"]):
            status, printed = run_command(argv)
            outputs.append(printed)
            assert status == 0, printed
            assert "Traceback" not in printed
            if argv[0] == "summary":
                assert all(f"skipped {path}" in printed for _, path in table_files(run_dir))
        for route, answer in dashboard_answers(run_dir.parent, "planted").items():
            outputs.append(answer.text)
            assert answer.status_code < 500, (route, answer.text)
    named = "\n".join(str(warning.message) for warning in caught)
    outputs.append(named)
    for table, path in table_files(run_dir):
        assert str(path) in named, table
    assert_no_canary(tmp_path, run_dir, outputs)


@pytest.mark.parametrize(
    "name",
    ["absmax", 'a"b', 'step" from stats; select "x', "x'); --", "naïve name", '"'],
)
def test_a_quoted_name_is_one_column_of_exactly_that_name(name):
    duckdb = pytest.importorskip("duckdb")
    quoted = quote_identifier(name)
    frame = duckdb.sql(f"select 1 as {quoted}").df()
    assert list(frame.columns) == [name]
    frame = duckdb.sql(f"select {quoted} from (select 2 as {quoted})").df()
    assert frame.iloc[0, 0] == 2


@pytest.mark.parametrize("name", ["", "a\x00b", "line\nbreak", "bell\x07", "del\x7f"])
def test_a_name_with_control_characters_is_refused(name):
    with pytest.raises(ValueError, match="name: expected a name without control characters"):
        quote_identifier(name)


def test_a_name_that_is_not_text_is_refused():
    with pytest.raises(TypeError, match="name: expected a string, got int"):
        quote_identifier(1)  # type: ignore[arg-type]
