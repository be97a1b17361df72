"""The examples that need no extra service run as they are, and say what they claim."""

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


@pytest.mark.slow  # one cold torch.compile, about 15 s
def test_compiled_example_has_no_graph_break_or_new_graph_after_its_first_call(tmp_path):
    out = run_example("compiled.py", cwd=tmp_path)
    assert "recorded steps: [0, 5, 10]" in out
    assert re.search(r"graph breaks after step 1: 0\n", out)
    assert re.search(r"graphs compiled after step 1: 0\n", out)


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


def test_whole_tensors_example_keeps_renders_and_animates(tmp_path):
    pytest.importorskip("safetensors")
    pytest.importorskip("matplotlib")
    from PIL import Image

    out = run_example("whole_tensors.py", "--out", tmp_path / "whole", cwd=tmp_path)
    assert "the run kept 48 whole tensors" in out  # 12 kept steps: 2 activations, 2 weights
    assert "whole tensors not kept: 0" in out
    drawn = re.search(r"the worker drew (\d+) heat maps.*; (\d+) it had no time for", out)
    assert drawn is not None
    # Each kept tensor drawn or dropped; where close() gave up on the worker, the one it was
    # drawing may have reached the disk as it was stopped, and counts as dropped too.
    assert 48 <= int(drawn.group(1)) + int(drawn.group(2)) <= 49
    animations = tmp_path / "whole" / "run" / "animations"
    for name in ("0-weight-heatmap.gif", "3-activation-pca.gif"):
        with Image.open(animations / name) as gif:
            assert gif.n_frames == 12


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


def test_attention_example_names_the_head_it_collapses(tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    import layerscope

    out = run_example("attention.py", tmp_path / "images", cwd=tmp_path)
    assert out == f"{tmp_path / 'images' / 'attention.png'}\n"
    assert (tmp_path / "images" / "attention.png").stat().st_size > 10_000
    run = layerscope.load(tmp_path / "runs" / "attention")
    alerts = run.alerts[run.alerts.rule == "attention_collapse"]
    assert set(zip(alerts.module, alerts.tensor, strict=True)) == {("blocks.2.attn", "head 1")}
    assert alerts.step.min() >= 50  # the step its queries grow 100 times
    last = run.attention[run.attention.step == run.attention.step.max()]
    lowest = last.sort_values("entropy_frac").iloc[0]
    assert (lowest.module, lowest["head"]) == ("blocks.2.attn", 1)
