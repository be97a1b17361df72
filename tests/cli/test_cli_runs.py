"""``layerscope runs``: each run's status, steps, ranks and alerts; finished, open and dead."""

import json
import subprocess
import sys

import pytest
import torch
from cli_runs import OLD_ALERT_COLUMNS, add_alerts, mark_crashed, rows_of, tiny_model, train

import layerscope

pytest.importorskip("duckdb")  # the commands query runs with DuckDB


def test_runs_lists_finished_running_and_crashed_runs_with_their_steps_and_alerts(tmp_path, cli):
    runs = tmp_path / "runs"
    train(tiny_model(), runs / "done", steps=3)
    crashed = train(tiny_model(), runs / "dead", steps=2)
    mark_crashed(crashed)
    alert = {"step": 1, "rule": "nan", "module": "0", "kind": "grad", "severity": "error",
             "message": "NaN", "rank": 0}  # fmt: skip
    add_alerts(crashed, [alert, {**alert, "step": 2}], columns=OLD_ALERT_COLUMNS)
    (runs / "notes").mkdir()  # a folder that is not a run is not listed

    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = layerscope.watch(model, optimizer=optimizer, run=runs / "live", every=1)
    try:
        for _ in range(4):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        scope.flush()
        status, out, err = cli("runs", runs, "--plain")
    finally:
        scope.close()

    assert (status, err) == (0, "")
    listed = {row[0]: row for row in rows_of(out, "runs under")}
    assert sorted(listed) == ["dead", "done", "live"]
    # name, status, steps, ranks, started, alerts
    assert [listed["done"][i] for i in (1, 2, 3, 5)] == ["finished", "3", "1", "0"]
    assert [listed["dead"][i] for i in (1, 2, 3, 5)] == ["crashed", "2", "1", "2"]
    assert [listed["live"][i] for i in (1, 2, 3, 5)] == ["running", "4", "1", "0"]
    assert listed["done"][4].endswith(" UTC")


def test_an_empty_folder_has_no_runs_and_the_default_folder_is_runs(tmp_path, cli, monkeypatch):
    status, out, _ = cli("runs", tmp_path, "--plain")
    assert (status, out) == (0, f"no runs under {tmp_path}\n")
    train(tiny_model(), tmp_path / "runs" / "exp1", steps=1)
    monkeypatch.chdir(tmp_path)
    status, out, _ = cli("runs", "--plain")
    assert status == 0
    assert [row[0] for row in rows_of(out, "runs under runs")] == ["exp1"]


def test_a_run_named_apart_from_its_folder_shows_where_it_is(tmp_path, cli):
    from layerscope.store import ParquetStore

    model = tiny_model()
    with layerscope.watch(
        model, every=1, run=ParquetStore(tmp_path / "folder", name="baseline")
    ) as scope:
        model(torch.randn(2, 4)).sum().backward()
        scope.step()
    _, out, _ = cli("runs", tmp_path, "--plain")
    (row,) = rows_of(out, "runs under")
    assert (row[0], row[-1]) == ("baseline", str(tmp_path / "folder"))


def _with_alerts(path):
    """A finished run whose input holds a NaN at each of 3 recorded steps: alerts written."""
    model = tiny_model()
    with layerscope.watch(model, run=path, every=1) as scope:
        for _ in range(3):
            inputs = torch.randn(8, 4)
            inputs[0, 0] = float("nan")
            model(inputs).nan_to_num().sum().backward()
            scope.step()
    return path


def test_runs_counts_alerts_from_run_json_without_pandas_or_pyarrow(tmp_path):
    runs = tmp_path / "runs"
    run = _with_alerts(runs / "nan")
    written = json.loads((run / "run.json").read_text())["written_alerts"]
    assert written == len(layerscope.load(run).alerts) > 0
    check = (
        "import sys; from layerscope.cli import main; main(['runs', sys.argv[1], '--plain']); "
        "print(sorted(m for m in ('pandas', 'pyarrow', 'duckdb') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(runs)], capture_output=True, text=True, check=True
    )
    *table, imported = done.stdout.strip().splitlines()
    assert imported == "[]"
    assert {row[0]: row[5] for row in rows_of("\n".join(table), "runs under")} == {
        "nan": str(written)
    }


def test_a_run_from_before_run_json_counted_alerts_has_them_read(tmp_path, cli):
    run = _with_alerts(tmp_path / "runs" / "old")
    meta = json.loads((run / "run.json").read_text())
    written = meta.pop("written_alerts")
    (run / "run.json").write_text(json.dumps(meta))
    status, out, _ = cli("runs", tmp_path / "runs", "--plain")
    assert status == 0
    assert rows_of(out, "runs under")[0][5] == str(written)
