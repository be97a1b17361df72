"""``watch(run=..., if_exists="new")``: a cell run again writes a run of its own, never into one."""

import pytest
import torch
from torch import nn

import layerscope
from layerscope.store import ParquetStore

pytest.importorskip("pyarrow")


def _train(path, steps=2, **options):
    model = nn.Linear(3, 2)
    with layerscope.watch(model, run=path, every=1, **options) as scope:
        for _ in range(steps):
            model(torch.ones(4, 3)).sum().backward()
            scope.step()
    return scope


def test_a_run_written_again_fails_by_default(tmp_path):
    _train(tmp_path / "x")
    with pytest.raises(FileExistsError):
        _train(tmp_path / "x")


def test_new_numbers_the_runs_and_leaves_the_first_as_it_was(tmp_path):
    first = _train(tmp_path / "x", steps=2)
    kept = (tmp_path / "x" / "run.json").read_bytes()
    second = _train(tmp_path / "x", steps=3, if_exists="new")
    third = _train(tmp_path / "x", steps=4, if_exists="new")
    assert first.run_path == str(tmp_path / "x")
    assert (second.run_path, third.run_path) == (str(tmp_path / "x-2"), str(tmp_path / "x-3"))
    assert (tmp_path / "x" / "run.json").read_bytes() == kept
    steps = [layerscope.load(tmp_path / name).meta["steps"] for name in ("x", "x-2", "x-3")]
    assert steps == [2, 3, 4]


def test_what_is_left_of_a_run_counts_as_a_run(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "modules.json").write_text("[]")  # a run whose run.json was lost
    scope = _train(tmp_path / "x", if_exists="new")
    assert scope.run_path == str(tmp_path / "x-2")
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["modules.json"]


def test_if_exists_is_checked():
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"if_exists: expected one of \('fail', 'new'\)"):
        layerscope.watch(model, run="runs/x", if_exists="overwrite")
    with pytest.raises(TypeError, match='if_exists: "new" chooses the run\'s path'):
        layerscope.watch(model, run=ParquetStore("memory://runs/x"), if_exists="new")
    assert not model._forward_hooks
