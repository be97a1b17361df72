"""No value from a run's files or from a request runs as SQL.

Each test plants a DuckDB statement that would write a file (``copy ... to``) in a place a
value can reach a query from: run.json's fields, modules.json's names, the values of a
table's key columns, a dashboard request's parameters. Every reader is then run over it, and
the file must not exist afterwards: a refused field is named, a planted name is data.
"""

import json
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli import main
from layerscope.store import RunFileError

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from layerscope.ui._app import create_app


def payloads(target):
    """Statements that write ``target`` if pasted into SQL, in a string or an identifier."""
    copy = f"copy (select 'x' as x) to '{target}'"
    return [
        f"0 group by name; {copy}; select 1 as name from scalars where 0 = 0",
        f"x'); {copy}; --",
        f"x' or 1 = 1; {copy}; --",
        f'x"; {copy}; --',
        f"x) as v; {copy}; --",
    ]


class Branches(nn.Module):
    """A model whose module names and output keys are SQL: names are data, never SQL."""

    def __init__(self, names):
        super().__init__()
        self.names = names
        for name in names:
            self.add_module(name, nn.Linear(4, 4))

    def forward(self, x):
        return {name: getattr(self, name)(x).relu() for name in self.names}


def record(path, names, steps=3):
    torch.manual_seed(0)
    model = Branches(names)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, run=path, every=1, alerts=False) as scope:
        for _ in range(steps):
            out = model(torch.randn(8, 4))
            loss = sum(value.pow(2).mean() for value in out.values())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return path


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A run whose module names, output keys and scalars hold the payloads, and its target."""
    root = tmp_path_factory.mktemp("planted")
    target = root / "INJECTED"
    assert "." not in str(target)  # module names cannot hold a dot: the payload must not
    names = list(payloads(target))
    run = record(root / "runs" / "planted", names)
    # Kinds, phases and scalar names come from layerscope itself: plant them in a segment.
    for table, columns in (("stats", ("kind", "phase", "tensor")), ("scalars", ("name",))):
        segment = sorted((run / table).glob("*.parquet"))[0]
        data = pq.read_table(segment)
        planted_rows = data.slice(0, 2 * len(names))
        for column in columns:
            values = [names[i % len(names)] for i in range(planted_rows.num_rows)]
            index = data.schema.get_field_index(column)
            kind = data.schema.field(index).type
            planted_rows = planted_rows.set_column(index, column, pa.array(values).cast(kind))
        # The recorded rows and the planted ones, under the file's own name.
        pq.write_table(pa.concat_tables([data, planted_rows]), segment)
    return run, target, names


def client_of(root):
    """The dashboard over ``root``, asked as a browser on this machine asks it."""
    return TestClient(create_app(root), base_url="http://127.0.0.1")


def every_reader(run_dir, client_root, names, target, capsys):
    """Run every reader over the run, in this process; the target must never appear."""
    run = layerscope.load(run_dir)
    for table in ("stats", "scalars", "alerts", "calls"):
        getattr(run, table)
    assert run.modules
    for argv in (
        ["summary", run_dir, "--plain"],
        ["summary", run_dir, "--plain", "--phase", names[0], "--kind", "grad"],
        ["runs", run_dir.parent, "--plain"],
        ["diff", run_dir, run_dir, "--plain"],
        ["plot", run_dir, "--out", run_dir.parent.parent / "plots"],
    ):
        main([str(arg) for arg in argv])
        capsys.readouterr()
    client = client_of(client_root)
    answers = [client.get("/api/runs"), client.get(f"/api/runs/{run_dir.name}")]
    for name in names:
        for route in ("heatmap", "series", "colordim", "distribution"):
            for parameter in ("module", "kind", "tensor", "phase", "stat"):
                query = {"module": names[0], "step": 1, parameter: name}
                answers.append(client.get(f"/api/runs/{run_dir.name}/{route}", params=query))
        answers.append(client.get(f"/api/runs/{run_dir.name}/scalars", params={"rank": name}))
    for answer in answers:
        assert answer.status_code < 500, answer.text
    assert all(answer.status_code == 200 for answer in answers[:2])
    assert not target.exists()
    return answers


def test_names_and_values_from_the_files_and_requests_are_data(planted, capsys):
    run_dir, target, names = planted
    every_reader(run_dir, run_dir.parent, names, target, capsys)
    # A planted module is found by its exact name: the value was bound, not pasted.
    client = client_of(run_dir.parent)
    for name in names:
        answer = client.get(
            f"/api/runs/{run_dir.name}/series", params={"module": name, "kind": "weight"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["module"] == name
        assert answer.json()["steps"] == [0, 1, 2]  # the weights after each of the 3 steps
    frame = layerscope.load(run_dir).sql(
        "select count(*) as n from stats where module = $name", {"name": names[1]}
    )
    assert frame.n.item() > 0
    assert not target.exists()


RUN_JSON_FIELDS = [
    ("rank", "rank"),
    ("steps", "steps"),
    ("written_rows", "written_rows"),
    ("world_size", "world_size"),
    ("status", "status"),
    ("histogram_edges", "histogram_edges"),
]
CONFIG_FIELDS = ["stats", "custom_stats", "kinds", "capture"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    return record(root / "runs" / "clean", ["a", "b"])


@pytest.mark.parametrize("field", [field for field, _ in RUN_JSON_FIELDS] + CONFIG_FIELDS)
@pytest.mark.parametrize("form", ["text", "list"])
def test_a_planted_run_json_field_is_refused_by_name(clean_run, tmp_path, field, form, capsys):
    target = tmp_path / "INJECTED.csv"
    run_dir = tmp_path / "runs" / "bad"
    shutil.copytree(clean_run, run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    payload = payloads(target)[0]
    value = payload if form == "text" else [payload]
    if field in CONFIG_FIELDS:
        meta["config"][field] = value
        # The deepest field at fault is named: the list's item, where the list is a list.
        named = f"config.{field}" + ("[0]" if form == "list" else "")
    else:
        meta[field] = value
        named = field
    (run_dir / "run.json").write_text(json.dumps(meta))
    if field in ("kinds", "capture") and form == "list":
        # Kinds are text a reader only shows: accepted, and still never SQL.
        layerscope.load(run_dir)
    else:
        with pytest.raises(RunFileError, match=f"run.json: {re.escape(named)}: expected"):
            layerscope.load(run_dir)
        status = main(["summary", str(run_dir), "--plain"])
        err = capsys.readouterr().err
        assert status == 2
        assert "run.json" in err
        assert named in err
        assert "Traceback" not in err
    client = client_of(run_dir.parent)
    for path in ("/api/runs", "/api/runs/bad", "/api/runs/bad/heatmap", "/api/runs/bad/alerts"):
        assert client.get(path).status_code < 500
    assert not target.exists()
