"""``layerscope.animate``: a frame per recorded step, GIF and MP4, each frame the run's own data."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image
from tests.plots.conftest import record

import layerscope
from layerscope.plots import _video, animation


def frames_of_gif(path):
    with Image.open(path) as image:
        assert image.format == "GIF"
        return image.n_frames, image.size


def expected_fractions(run, module, kind):
    """step -> counts / numel per slot, from the whole stats table (histograms widened)."""
    stats = run.stats
    rows = stats[(stats["module"] == module) & (stats["kind"] == kind) & (stats["call"] == 0)]
    rows = rows[~rows["sentinel"].fillna(False).astype(bool)].sort_values("step")
    return {
        int(step): np.asarray(hist, dtype=np.float64) / numel
        for step, hist, numel in zip(rows["step"], rows["hist"], rows["numel"], strict=True)
    }


def test_gif_in_the_run_directory_has_a_frame_per_recorded_step(run):
    path = layerscope.animate(run, "1", "activation")
    assert str(path).startswith(run.path)
    assert path.name == "1-activation-histogram.gif"
    frames, size = frames_of_gif(path)
    assert frames == 5  # the fixture's steps
    assert size == (512, 288)


def test_each_frame_draws_the_steps_histogram(run, monkeypatch):
    drawn = {}

    def keep(fig, draw, frames, path, fps):
        for index in range(frames):
            draw(index)
            bars = fig.axes[0].patches
            caption = fig.axes[0].texts[0].get_text()
            step = int(re.search(r"step (\d+)", caption).group(1))
            lefts = np.array([bar.get_x() for bar in bars])
            drawn[step] = (lefts, np.array([bar.get_height() for bar in bars]))
        assert fig.axes[0].get_xlabel().startswith("log2 |value|")

    monkeypatch.setattr(animation, "_save", keep)
    layerscope.animate(run, "0", "grad", path=run.path + "/x.gif", steps=[3, 1])
    assert sorted(drawn) == [1, 3]
    expected = expected_fractions(run, "0", "grad")
    edges = np.asarray(run.meta["histogram_edges"])
    for step, (lefts, heights) in drawn.items():
        slots = np.searchsorted(np.log2(edges[1:-1]), lefts) + 1  # bar left edge -> slot
        np.testing.assert_allclose(heights, expected[step][slots], rtol=1e-12)
        # Every finite magnitude the step holds is among the bars.
        assert heights.sum() == pytest.approx(expected[step][1:-1].sum())


def test_chosen_steps_in_a_given_path(run, tmp_path):
    path = layerscope.animate(run.path, "2", "weight", path=tmp_path / "w.gif", steps=[4, 0, 2])
    assert path == tmp_path / "w.gif"
    assert frames_of_gif(path)[0] == 3
    assert not list(tmp_path.glob(".*partial*"))  # written beside, then renamed


@pytest.mark.skipif(_video.ffmpeg_path() is None, reason="no ffmpeg")
def test_mp4_has_a_frame_per_step(run, tmp_path):
    path = layerscope.animate(run, "1", "activation", path=tmp_path / "a.mp4", fps=5)
    probe = subprocess.run(
        [_video.ffmpeg_path(), "-i", str(path), "-map", "0:v:0", "-f", "null", "-"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert re.findall(r"frame=\s*(\d+)", probe.stderr)[-1] == "5"
    assert "h264" in probe.stderr


def test_mp4_without_ffmpeg_says_what_to_install(run, tmp_path, monkeypatch):
    monkeypatch.setattr(_video, "ffmpeg_path", lambda: None)
    with pytest.raises(RuntimeError, match="imageio-ffmpeg"):
        layerscope.animate(run, "1", path=tmp_path / "a.mp4")
    assert not list(tmp_path.iterdir())


def test_nan_and_single_step_runs_animate(nan_run, single_step_run, tmp_path):
    assert frames_of_gif(layerscope.animate(nan_run, "0", path=tmp_path / "n.gif"))[0] == 4
    assert frames_of_gif(layerscope.animate(single_step_run, "2", path=tmp_path / "o.gif"))[0] == 1


def test_a_scope_in_memory_needs_a_path(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    with layerscope.watch(model, every=1) as scope:
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
            scope.step()
        with pytest.raises(ValueError, match="path: the run is in memory"):
            layerscope.animate(scope, "1")
        path = layerscope.animate(scope, "1", path=tmp_path / "m.gif")
    assert frames_of_gif(path)[0] == 3


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"what": "pca"}, "what: expected one of"),
        ({"path": "x.png"}, r"path: expected a name ending in \.gif or \.mp4"),
        ({"fps": 0}, "fps: expected a positive number"),
        ({"steps": [99]}, r"steps: \[99\] not recorded"),
        ({"kind": "gradient"}, "kind: expected one of"),
        ({"module": "nope"}, "modules: unknown modules"),
    ],
)
def test_bad_arguments_name_themselves(run, arguments, match):
    arguments = {"module": "1", **arguments}
    with pytest.raises(ValueError, match=match):
        layerscope.animate(run, **arguments)


def test_run_must_be_a_run(tmp_path):
    with pytest.raises(TypeError, match="source: expected"):
        layerscope.animate(3, "1")
    with pytest.raises(FileNotFoundError):
        layerscope.animate(tmp_path / "none", "1")


def test_animation_is_made_from_a_fresh_run(tmp_path):
    path = record(tmp_path / "fresh", 2)
    frames, _ = frames_of_gif(layerscope.animate(path, "0"))
    assert frames == 2
