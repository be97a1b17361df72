"""The examples that need no extra service run as they are, and say what they claim.

Those the documentation shows the output of run in tests/test_doc_outputs.py instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name, *args, cwd):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_figures_example_writes_every_figure(tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    out = run_example("figures.py", tmp_path / "images", cwd=tmp_path)
    written = sorted(path.name for path in (tmp_path / "images").iterdir())
    figures = ("stats", "color_dim", "dead_chart", "heatmap", "precision", "grad_norms")
    figures += ("update_ratio", "histogram", "scalars")
    assert written == sorted([*(f"{name}.png" for name in figures), "grad_histogram.gif"])
    assert out.count("\n") == len(written)
    assert (tmp_path / "runs" / "figures" / "run.json").exists()


def test_digits_example_learns_and_records(tmp_path):
    pytest.importorskip("sklearn")
    out = run_example("digits.py", cwd=tmp_path)
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", out).group(1))
    assert accuracy > 80
    assert re.search(r"recorded \d+ rows at steps \[0, 1, 2", out)


def test_torchember_example_names_inputs_keeps_each_kinds_statistics_and_every_order(tmp_path):
    out = run_example("migrating/from_torchember.py", cwd=tmp_path)
    assert "encoder's input rows: ['in.input']" in out
    assert re.search(r"encoder's output rms at step 0: \d+\.\d{6}\n", out)
    assert "rms of weight rows: all null" in out
    assert "modules: ['', 'encoder', 'left', 'right']" in out
    assert "step 2 entered: ['encoder', 'left']" in out
    assert "step 3 entered: ['encoder', 'right']" in out


def test_tensor_tracker_example_keeps_floats_events_reductions_and_predicates(tmp_path):
    out = run_example("migrating/from_tensor_tracker.py", cwd=tmp_path)
    assert "stash_value kept: [('0', 'float'), ('2', 'float')]" in out
    assert "stash kept: [('activation', 'Linear'), ('grad', 'Linear')]" in out
    assert re.search(r"1 activation\s+3\n\s+3 activation\s+3\n", out)
    assert "predicate picked: ['0', '2']" in out


def test_pytorch_inspector_example_films_activations_and_weight_gradients(tmp_path):
    pytest.importorskip("matplotlib")
    out = run_example("migrating/from_pytorch_inspector.py", "--out", tmp_path, cwd=tmp_path)
    for name in ("0-activation-out", "0-weight_grad-weight", "0-weight_grad-bias"):
        assert f"run/videos/heatmap/{name}-train.gif: 4 frames" in out
    assert "frames dropped: 0" in out
