"""A run whose files lack columns it declares reads whole: those values unknown, never a crash.

Each table's file of a small real run is written again without some of its columns, footer
and all sound, as an older layerscope or another program could have written it. A column the
run declares but no file has (``numel``, ``sentinel``, a statistic, the histogram, an alert's
``phase``, an attention statistic, a call's number) is in every table as NULL, for
``load()``'s frames and ``run.sql`` alike; a key column missing (a scalar's ``name``) makes the
file another table's: left out and named. Then every reader reads the run: the command's
``summary``, ``export``, ``plot`` and ``report``, ``run.plot`` and the dashboard's routes.

And a folder of runs on another filesystem lists each run at a location that opens that
run, also one named like an fsspec chain (``memory://runs/a::b``).
"""

from __future__ import annotations

import io
import shutil
import uuid
import warnings

import pyarrow.parquet as pq
import pytest
from tests.fixtures.every_table_run import record

import layerscope
from layerscope.cli import main
from layerscope.model import quote_identifier
from layerscope.store import run_folders

pytest.importorskip("starlette")
pytest.importorskip("matplotlib")
from starlette.testclient import TestClient

from layerscope.ui._app import create_app

# The columns each table's file loses; none is a key column.
UNKNOWN = {
    "stats": ("numel", "sentinel", "mean", "hist", "module_type", "dtype", "shape"),
    "alerts": ("phase", "kind", "value"),
    "attention": ("keys", "entropy_min", "max_prob"),
    "calls": ("call",),
}
# A key column lost: the file is not one of its table's, and is left out.
KEYLESS = ("scalars", "name")
# What ``plot`` draws here: one kind's figures, of a few layers, small.
FEW_FIGURES = ("--modules", "mlp", "--dpi", "20")
ROUTES = ("modules", "scalars", "alerts", "heatmap", "series", "colordim", "distribution")


def table_file(run, table):
    """The one file of ``table`` (a finished run's tables are compacted to one each)."""
    if table == "calls":
        return run / "calls.parquet"
    (path,) = (run / table).glob("*.parquet")
    return path


def drop_columns(path, names):
    """``path`` written again without the columns ``names``, its footer's metadata kept."""
    data = pq.read_table(path)
    assert set(names) <= set(data.column_names), path
    pq.write_table(data.drop_columns(list(names)), path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``base``; ``lacking``, a copy whose files lack ``UNKNOWN``'s columns and ``KEYLESS``;
    ``countless``, one whose statistics lack ``numel`` only, their histograms kept."""
    root = tmp_path_factory.mktemp("missing") / "runs"
    base = record(root / "base")
    lacking, countless = root / "lacking", root / "countless"
    for copy in (lacking, countless):
        shutil.copytree(base, copy)
    for table, names in {**UNKNOWN, KEYLESS[0]: (KEYLESS[1],)}.items():
        drop_columns(table_file(lacking, table), names)
    drop_columns(table_file(countless, "stats"), ["numel"])
    return base, lacking, countless


def command(*argv):
    """``layerscope ARGV`` in this process: its status and all it printed."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", out)
        status = main([str(arg) for arg in argv])
    return status, out.getvalue()


def test_a_declared_column_no_file_has_is_null_in_every_table(runs):
    base, lacking, _ = runs
    original = layerscope.load(base)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = layerscope.load(lacking)
        for table, names in UNKNOWN.items():
            frame = getattr(run, table)
            assert len(frame) == len(getattr(original, table)) > 0, table
            shown = ", ".join(quote_identifier(name) for name in names)
            queried = run.sql(f"select {shown} from {quote_identifier(table)}")
            assert len(queried) == len(frame), table
            for name in names:
                assert frame[name].isna().all(), (table, name)
                assert queried[name].isna().all(), (table, name)
        # A key column lost: the file is another table's, left out and named.
        assert run.scalars.empty
        assert len(original.scalars) == 3
        assert run.sql("select count(*) as n from scalars").n.item() == 0
    keyless = str(table_file(lacking, KEYLESS[0]))
    assert f"no column {KEYLESS[1]}" in run.skipped[keyless]
    # and its folder, whose files now hold fewer rows than run.json counts
    assert sorted(run.skipped) == [str(lacking / KEYLESS[0]), keyless]
    assert any(keyless in str(warning.message) for warning in caught)
    # The columns the files kept read as they were written.
    kept = run.stats.drop(columns=list(UNKNOWN["stats"]))
    assert kept.equals(original.stats.drop(columns=list(UNKNOWN["stats"])))


@pytest.mark.filterwarnings("ignore::layerscope.LayerscopeWarning")
def test_the_command_reads_a_run_whose_files_lack_columns(runs, tmp_path):
    _, lacking, countless = runs
    for argv in (
        ["summary", lacking, "--plain"],
        ["plot", lacking, "--out", tmp_path / "plots", "--kind", "activation", *FEW_FIGURES],
        ["report", lacking, "-o", tmp_path / "report.html"],
    ):
        status, printed = command(*argv)
        assert status == 0, printed
        assert "Traceback" not in printed, printed
        assert "Error" not in printed, printed
        if argv[0] == "summary":  # the fp8 losses need numel: not known, not "nothing lost"
            assert "e4m3  not known (the run's files lack numel)" in printed, printed
    assert any((tmp_path / "plots").glob("*.png"))
    assert (tmp_path / "report.html").stat().st_size > 0
    pytest.importorskip("tensorboard")
    for run in (lacking, countless):  # a histogram's summary counts values by numel
        folder = tmp_path / "tensorboard" / run.name
        status, printed = command("export", run, "--tensorboard", folder)
        assert status == 0, printed
        assert "rows of statistics" in printed, printed
        assert any(folder.iterdir())


@pytest.mark.filterwarnings("ignore::layerscope.LayerscopeWarning")
def test_figures_and_dashboard_read_a_run_whose_files_lack_columns(runs):
    lacking = runs[1]
    run = layerscope.load(lacking)
    figures = [
        run.plot.heatmap("absmax", kind="activation"),
        run.plot.stats(kind="activation"),
        run.plot.color_dim(kind="activation"),
        run.plot.attention(),
    ]
    assert all(figure.axes for figure in figures)
    client = TestClient(create_app(lacking.parent), base_url="http://127.0.0.1")
    query = {"module": "mlp.0", "kind": "activation", "step": 0}
    answers = {"run": client.get("/api/runs/lacking")}
    for route in ROUTES:
        answers[route] = client.get(f"/api/runs/lacking/{route}", params=query)
    answers["attention"] = client.get("/api/runs/lacking/attention")
    for route, answer in answers.items():
        assert answer.status_code == 200, (route, answer.text)
    assert answers["alerts"].json()["alerts"], answers["alerts"].text


def test_a_remote_folder_lists_a_run_named_like_a_chain_where_it_is(runs):
    fsspec = pytest.importorskip("fsspec")
    fs, root = fsspec.filesystem("memory"), f"/layerscope-listing-{uuid.uuid4().hex}"
    fs.put(str(runs[0]), f"{root}/a::b", recursive=True)
    try:
        listed = layerscope.runs(f"memory:/{root}")
        assert listed[["status", "steps", "error"]].values.tolist() == [["finished", 3, None]]
        assert listed.path.tolist() == [f"memory:/{root}/a::b"]
        ((name, location),) = run_folders(f"memory:/{root}")
        assert (name, location) == ("a::b", f"memory:/{root}/a::b")  # shown as its URL
        run = layerscope.load(location)  # and opened where it was found
        assert run.sql("select count(*) as n from stats").n.item() == len(run.stats) > 0
        assert run.skipped == {}
    finally:
        fs.rm(root, recursive=True)
