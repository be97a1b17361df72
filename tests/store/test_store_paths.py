"""A run's path is a path: folders named like patterns (``a?``, ``a*``, ``exp[1]``) or fsspec
chains (``a::b``) are written and read as themselves, never as the runs their names match."""

import os
import re
import shutil

import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli import main

pytest.importorskip("duckdb")
fsspec = pytest.importorskip("fsspec")

# Each run a different number of steps, so that rows read from another run show. The first
# three are what the others' names match as patterns (``a?``: a1, ab, a*...; ``exp[1]``: exp1).
STEPS = {"a1": 1, "ab": 2, "exp1": 3, "a?": 4, "a*": 5, "exp[1]": 6, "a::b": 7}
PATTERNS = ["a?", "a*", "exp[1]", "a::b"]


def record(path, steps):
    torch.manual_seed(steps)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with layerscope.watch(model, run=path, every=1, alerts=False) as scope:
        for _ in range(steps):
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            scope.step(loss=loss)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The runs, each written under a plain name, then moved to its own (the reader's test)."""
    written = tmp_path_factory.mktemp("written")
    root = tmp_path_factory.mktemp("paths")
    for name, steps in STEPS.items():
        record(str(written / f"run{steps}"), steps)
        shutil.move(written / f"run{steps}", root / name)
    return root


def test_the_writer_takes_a_path_as_it_is(tmp_path):
    record(str(tmp_path / "a::b"), 1)
    record(str(tmp_path / "c[1]"), 1)
    assert sorted(os.listdir(tmp_path)) == ["a::b", "c[1]"]
    assert (tmp_path / "a::b" / "run.json").is_file()


@pytest.mark.parametrize("name", PATTERNS)
def test_a_run_reads_its_own_rows_whatever_its_folder_is_named(folder, name):
    steps = STEPS[name]
    run = layerscope.load(str(folder / name))
    assert run.meta["steps"] == steps
    assert sorted(set(run.stats.step)) == list(range(steps))
    assert sorted(run.scalars.step) == list(range(steps))
    # DuckDB reads the files the reader listed, not those a pattern made of the path matches.
    assert run.sql("select count(distinct step) n from stats").n[0] == steps
    assert run.sql("select count(*) n from scalars").n[0] == steps
    assert run.sql("select max(step) s from calls").s[0] == steps - 1
    assert run.skipped == {}


def test_runs_lists_each_run_under_its_own_name_and_steps(folder):
    listed = layerscope.runs(folder)
    assert listed.error.isna().all(), listed.error.tolist()
    shown = dict(zip(map(os.path.basename, listed.path), listed.steps, strict=True))
    assert shown == STEPS


@pytest.mark.parametrize("name", ["exp[1]", "a?", "a::b"])
def test_summary_shows_the_run_it_was_given(folder, name, capsys):
    assert main(["summary", str(folder / name), "--plain"]) == 0
    out = capsys.readouterr().out
    last = STEPS[name] - 1
    assert re.search(rf"^steps\s+{STEPS[name]}$", out, re.M), out
    assert re.search(rf"^loss\s+\S+ at step {last} ", out, re.M), out
    assert f"steps 0 to {last})" in out


def test_a_url_whose_path_holds_pattern_characters_reads_as_itself(folder):
    fs = fsspec.filesystem("memory")
    for name in ("exp1", "exp[1]"):
        for directory, _, files in os.walk(folder / name):
            relative = os.path.relpath(directory, folder)
            for file in files:
                with open(os.path.join(directory, file), "rb") as source:
                    fs.pipe(f"/layerscope-paths/{relative}/{file}", source.read())
    try:
        run = layerscope.load("memory://layerscope-paths/exp[1]")
        assert run.sql("select count(distinct step) n from stats").n[0] == STEPS["exp[1]"]
        assert len(run.scalars) == STEPS["exp[1]"]
    finally:
        fs.rm("/layerscope-paths", recursive=True)


def test_only_a_string_with_a_protocol_that_is_no_local_path_is_a_url(tmp_path, monkeypatch):
    from layerscope.store.locations import location_filesystem

    monkeypatch.chdir(tmp_path)
    fs, path = location_filesystem("a::b")
    assert (fs.protocol[0], path) == ("file", f"{tmp_path}/a::b")
    fs, path = location_filesystem("memory://x/exp[1]")
    assert (fs.protocol, path) == ("memory", "/x/exp[1]")
    os.makedirs("memory:/x")  # "memory://x" as a local path, which exists: local it is
    fs, path = location_filesystem("memory://x")
    assert (fs.protocol[0], path) == ("file", f"{tmp_path}/memory://x")
