"""``watch(kinds=...)`` chooses what is recorded; ``capture=``, its old name, still works.

The old name warns with a FutureWarning and records the same rows; both names at once are an
error. A run saves its kinds as ``kinds`` in ``run.json``, and a run saved before, under
``capture``, still loads and shows its kinds.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli import main
from layerscope.model import DEFAULT_KINDS

pytest.importorskip("pandas")

KINDS = ("activation", "weight")


def _record(run=None, **choice):
    """Two recorded steps of a tiny model; the scope."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with layerscope.watch(model, run=run, every=1, **choice) as scope:
        for _ in range(2):
            model(torch.randn(5, 3)).pow(2).mean().backward()
            scope.step()
    return scope


def _rows(scope):
    frame = scope.frame()
    columns = ["step", "module", "kind", "tensor", "mean", "absmax"]
    return frame[columns].sort_values(columns[:4]).reset_index(drop=True)


def test_kinds_records_exactly_those_kinds():
    assert set(_record(kinds=KINDS).frame().kind) == set(KINDS)
    assert set(_record(kinds="grad").frame().kind) == {"grad"}


def test_capture_records_the_same_rows_and_warns_once_naming_kinds():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = _record(capture=KINDS)
    renamed = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(renamed) == 1
    assert "kinds=" in str(renamed[0].message)
    assert "capture=" in str(renamed[0].message)
    assert renamed[0].filename == __file__  # it points at the call that passed capture=
    new = _rows(_record(kinds=KINDS))
    assert set(new.kind) == set(KINDS)
    assert _rows(old).equals(new)


def test_kinds_is_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        _record(kinds=KINDS)


@pytest.mark.parametrize("kinds", [KINDS, list(DEFAULT_KINDS)])  # the default, given
def test_kinds_and_capture_together_raise_naming_both(kinds):
    with pytest.raises(TypeError, match=r"kinds=.*capture=") as raised:
        layerscope.watch(nn.Linear(3, 2), kinds=kinds, capture=("grad",))
    assert "kinds=" in str(raised.value)
    assert "capture=" in str(raised.value)


def test_a_run_saves_its_kinds_as_kinds(tmp_path):
    _record(run=tmp_path / "run", kinds=KINDS)
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert config["kinds"] == sorted(KINDS)
    assert "capture" not in config
    assert layerscope.load(tmp_path / "run").meta["config"]["kinds"] == sorted(KINDS)


def _summary_kinds(run_dir, capsys) -> str:
    assert main(["summary", str(run_dir), "--plain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [line for line in lines if line.split()[:1] == ["kinds"]]
    return line.split(maxsplit=1)[1]


def test_the_summary_shows_a_runs_kinds(tmp_path, capsys):
    _record(run=tmp_path / "run", kinds=KINDS)
    assert _summary_kinds(tmp_path / "run", capsys) == "activation, weight"


def test_a_run_saved_under_the_old_capture_key_still_loads_and_shows_its_kinds(tmp_path, capsys):
    run_dir = tmp_path / "old"
    _record(run=run_dir, kinds=("grad", "weight"))
    meta_file = run_dir / "run.json"
    meta = json.loads(meta_file.read_text())
    meta["config"]["capture"] = meta["config"].pop("kinds")
    meta_file.write_text(json.dumps(meta))
    run = layerscope.load(run_dir)
    assert set(run.stats.kind) == {"grad", "weight"}
    assert _summary_kinds(run_dir, capsys) == "grad, weight"
