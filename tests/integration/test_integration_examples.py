"""The trainer callback examples run as a person would run them, and write the runs they say.

Each runs in a fresh interpreter (importing Lightning or transformers there takes most of
its time), writes into a temporary directory, and the run is read back from where it should
be: the logger's versioned directory, or the Trainer's output_dir.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import layerscope

pytest.importorskip("pandas")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Both examples record the steps their validation follows: 9, 19, ...
RECORDED = [9, 19]


def _run_example(name: str, out: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--out", str(out), "--steps", "20"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_the_lightning_example_writes_its_run_in_the_loggers_directory(tmp_path):
    pytest.importorskip("lightning")
    stdout = _run_example("lightning_callback.py", tmp_path)
    path = tmp_path / "lightning_logs" / "version_0" / "layerscope"
    assert f"run {path}: finished, 20 steps" in stdout
    run = layerscope.load(path)
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == RECORDED
    assert sorted(set(run.stats[run.stats.phase == "eval"].step)) == RECORDED
    assert set(run.stats.kind) == {"activation", "grad", "weight", "update"}
    scalars = run.scalars
    for name in ("loss", "lr"):
        assert sorted(scalars[scalars.name == name].step) == list(range(20)), name
    assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").exists()


@pytest.mark.slow
def test_the_transformers_example_writes_its_run_in_the_output_dir(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    stdout = _run_example("transformers_callback.py", tmp_path)
    path = tmp_path / "layerscope"
    assert f"run {path}: finished, 20 steps" in stdout
    run = layerscope.load(path)
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == RECORDED
    assert sorted(set(run.stats[run.stats.phase == "eval"].step)) == RECORDED
    scalars = run.scalars
    for name in ("loss", "learning_rate", "grad_norm"):
        assert sorted(scalars[scalars.name == name].step) == [4, 9, 14, 19], name
    assert sorted(scalars[scalars.name == "eval_loss"].step) == RECORDED
