"""Videos written while training runs: frames streamed to the file, the file whole at close.

And ``tensors={"every_seconds": ...}``: which steps keep (and reach ``on_tensor``), decided
on an injected clock, never by sleeping.
"""

from __future__ import annotations

import json
import pickle
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import layerscope
from layerscope.tensors import HeatMap, Histogram, Record, Video, VideoWriter, _spec, ffmpeg_path

matplotlib = pytest.importorskip("matplotlib")
NO_FFMPEG = pytest.mark.skipif(ffmpeg_path() is None, reason="no ffmpeg")
HEIGHT, WIDTH = 288, 512


def gif_frames(path: Path) -> list[np.ndarray]:
    with Image.open(path) as image:
        frames = []
        for index in range(image.n_frames):
            image.seek(index)
            frames.append(np.asarray(image.convert("RGB")))
        return frames


def mp4_frames(path: Path) -> list[np.ndarray]:
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    return [np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader]


def frame(index: int) -> np.ndarray:
    """A frame whose left ``16 * index`` columns are red, the rest blue."""
    rgba = np.zeros((HEIGHT, WIDTH, 4), np.uint8)
    rgba[..., 2] = rgba[..., 3] = 255
    rgba[:, : 16 * index, :3] = (255, 0, 0)
    return rgba


@pytest.mark.parametrize("suffix", [".gif", pytest.param(".mp4", marks=NO_FFMPEG)])
def test_frames_appended_one_by_one_are_all_in_the_file_after_close(tmp_path, suffix):
    path = tmp_path / f"v{suffix}"
    writer = VideoWriter(path, fps=4)
    for index in range(12):
        writer.append(frame(index))
        assert not path.exists()  # written beside its name until closed
    assert writer.close() == path
    assert list(tmp_path.iterdir()) == [path]  # the partial file was renamed
    read = gif_frames(path) if suffix == ".gif" else mp4_frames(path)
    assert len(read) == 12
    for index, image in enumerate(read):
        assert image.shape[:2] == (HEIGHT, WIDTH)
        red = image[HEIGHT // 2, :, 0] > 128  # the red columns of this frame, decoded
        assert abs(int(red.sum()) - 16 * index) <= 2, index


@pytest.mark.parametrize("suffix", [".gif", pytest.param(".mp4", marks=NO_FFMPEG)])
def test_memory_stays_that_of_a_few_frames_however_many_are_written(tmp_path, suffix):
    writer = VideoWriter(tmp_path / f"v{suffix}", fps=10)
    one = frame(3)
    writer.append(one)  # the writer started before measuring
    tracemalloc.start()
    try:
        for _ in range(60):  # 60 frames of 590 KB: 35 MB if they were kept
            writer.append(one)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    writer.close()
    assert peak < 4 * one.nbytes


def test_a_discarded_video_leaves_nothing_and_bad_frames_are_refused(tmp_path):
    writer = VideoWriter(tmp_path / "v.gif", fps=4)
    writer.append(frame(1))
    with pytest.raises(ValueError, match="frame: 10 x 10 pixels"):
        writer.append(np.zeros((10, 10, 4), np.uint8))
    writer.discard()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"path: expected a \.gif or \.mp4"):
        VideoWriter(tmp_path / "v.avi", fps=4)


def _record(value, step, tensor="out"):
    return Record(module="blocks.0", type="Linear", kind="activation", tensor=tensor,
                  step=step, phase="train", call=0, value=value)  # fmt: skip


def test_video_appends_each_record_to_its_tensor_s_file_and_close_finishes_them(tmp_path):
    video = Video(Histogram(bins=8), format="gif", fps=2)
    for step in range(5):
        video(_record(torch.randn(4, 6), step), tmp_path)
        video(_record(torch.randn(3), step, tensor="out.1"), tmp_path)
    folder = tmp_path / "videos" / "histogram"
    first, second = (
        folder / "blocks.0-activation-out-train.gif",
        folder / "blocks.0-activation-out.1-train.gif",
    )
    assert not first.exists()
    assert not second.exists()
    video.close()
    assert sorted(folder.iterdir()) == [first, second]
    assert [len(gif_frames(path)) for path in (first, second)] == [5, 5]
    assert gif_frames(first)[0].shape == (HEIGHT, WIDTH, 3)


@pytest.mark.parametrize("fmt", ["gif", pytest.param("mp4", marks=NO_FFMPEG)])
def test_a_worker_started_again_appends_to_the_videos_the_one_before_wrote(tmp_path, fmt):
    video = Video(HeatMap(), format=fmt, fps=4)
    values = [torch.randn(6, 8, generator=torch.Generator().manual_seed(n)) for n in range(7)]
    for step in range(4):
        video(_record(values[step], step), tmp_path)
    video.close()  # as a worker ending after its callback failed
    again = pickle.loads(pickle.dumps(video))  # the new worker's copy: no open file
    for step in range(4, 7):
        path = again(_record(values[step], step), tmp_path)
    again.close()
    folder = tmp_path / "videos" / "heatmap"
    assert path == folder / f"blocks.0-activation-out-train.{fmt}"
    assert sorted(p.name for p in folder.iterdir()) == [path.name]  # no -2, nothing hidden
    read = gif_frames(path) if fmt == "gif" else mp4_frames(path)
    assert len(read) == 7
    # Each frame is its own step's: drawn alone, the same value gives the same picture.
    alone = Video(HeatMap(), format=fmt, fps=4)
    for step in range(7):
        alone(_record(values[step], step), tmp_path / "alone")
    alone.close()
    expected = (gif_frames if fmt == "gif" else mp4_frames)(
        tmp_path / "alone" / "videos" / "heatmap" / path.name
    )
    for got, want in zip(read, expected, strict=True):
        assert np.abs(got.astype(int) - want.astype(int)).mean() < 4


def test_a_resumed_writer_that_gets_no_frame_leaves_the_earlier_video_as_it_was(tmp_path):
    path = tmp_path / "v.gif"
    first = VideoWriter(path, fps=4)
    for index in range(3):
        first.append(frame(index))
    first.close()
    before = path.read_bytes()
    resumed = VideoWriter(path, fps=4, resume=True)
    assert resumed.close() == path
    assert path.read_bytes() == before
    discarded = VideoWriter(path, fps=4, resume=True)
    discarded.append(frame(5))
    discarded.discard()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.gif"]
    with pytest.raises(ValueError, match="frame: 10 x 10 pixels, and the video's are 512 x 288"):
        VideoWriter(path, fps=4, resume=True).append(np.zeros((10, 10, 4), np.uint8))


def test_a_damaged_video_index_begins_new_files_and_is_never_followed_out(tmp_path):
    folder = tmp_path / "videos" / "histogram"
    folder.mkdir(parents=True)
    (tmp_path / "outside.gif").write_bytes(b"GIF89a not a video;")
    key = ["blocks.0", "activation", "out", "train"]
    index = tmp_path / "videos" / ".histogram.json"
    index.write_text(json.dumps({"../../outside.gif": key}))
    video = Video(Histogram(bins=8), format="gif", fps=2)
    path = video(_record(torch.randn(4, 6), 0), tmp_path)
    video.close()
    assert path == folder / "blocks.0-activation-out-train.gif"
    assert (tmp_path / "outside.gif").read_bytes() == b"GIF89a not a video;"
    index.write_text("{not json")
    again = Video(Histogram(bins=8), format="gif", fps=2)
    assert again(_record(torch.randn(4, 6), 1), tmp_path) == folder / (
        "blocks.0-activation-out-train-2.gif"
    )
    again.close()


def test_video_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="format: expected 'mp4' or 'gif'"):
        Video(format="avi")
    with pytest.raises(TypeError, match="renderer: expected a HeatMap"):
        Video(renderer=print)
    with pytest.raises(ValueError, match="fps"):
        Video(fps=0)
    with pytest.raises(ValueError, match="directory: Video writes its files"):
        Video()(_record(torch.ones(2, 2), 0), None)
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="workers: a Video writes each tensor's file"):
        layerscope.watch(model, tensors="^$", on_tensor=Video(), workers=2)


@pytest.mark.slow  # a spawned worker imports torch and matplotlib
@pytest.mark.parametrize("fmt", ["gif", pytest.param("mp4", marks=NO_FFMPEG)])
def test_a_video_of_a_watched_run_is_written_by_its_worker_and_whole_at_close(tmp_path, fmt):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    tensors = {"include": "^0$", "kinds": "activation", "every": 1, "keep": False}
    scope = layerscope.watch(
        model, run=tmp_path / "run", every=1, tensors=tensors, on_tensor=Video(HeatMap(), fmt)
    )
    with scope:
        for _ in range(6):
            model(torch.randn(5, 4)).sum().backward()
            scope.step()
        # A spawned worker starts slowly on a loaded machine: wait for it past the 10 s.
        scope.close(timeout=120)
    path = tmp_path / "run" / "videos" / "heatmap" / f"0-activation-out-train.{fmt}"
    frames = gif_frames(path) if fmt == "gif" else mp4_frames(path)
    assert len(frames) == 6 - scope.on_tensor_dropped == 6
    assert not list(path.parent.glob(".*"))  # no partial file left


def test_every_seconds_keeps_a_step_only_once_that_many_seconds_passed():
    times = iter(
        [0.0, 0.5, 1.0, 1.2, 2.6, 2.7, 3.0]
    )  # the clock as each kept-by-number step begins
    spec = _spec.parse_tensors({"include": "x", "every": 2, "every_seconds": 1.0})
    kept = _spec.KeptSteps(spec, lambda step: False, clock=lambda: next(times))
    chosen = [step for step in range(14) if kept.keeps(step)]
    # Steps 0, 2, 4, ... at 0.0, 0.5, 1.0, 1.2, 2.6, 2.7, 3.0 s: kept at 0.0, 1.0, 2.6.
    assert chosen == [0, 4, 8]
    assert [kept.keeps(step) for step in (0, 4, 8)] == [True, True, True]  # decided once


def test_every_seconds_chooses_the_steps_a_watched_run_keeps(monkeypatch):
    pytest.importorskip("safetensors")
    now = [0.0]
    monkeypatch.setattr(_spec, "_now", lambda: now[0])
    # Seconds as each step begins: step 0 at watch(), step s + 1 at the end of step s.
    begins = [0.0, 0.4, 0.9, 1.1, 1.5, 2.3, 2.4]
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    tensors = {"include": "^0$", "kinds": "activation", "every": 1, "every_seconds": 1.0}
    with layerscope.watch(model, every=1, tensors=tensors) as scope:
        for step in range(len(begins) - 1):
            model(torch.randn(3, 4)).sum()
            now[0] = begins[step + 1]
            scope.step()
    assert [record.step for record in scope.tensors] == [0, 3, 5]


def test_every_seconds_is_checked():
    with pytest.raises(ValueError, match="tensors: every_seconds: expected a number"):
        _spec.parse_tensors({"include": "x", "every_seconds": -1})
    spec = _spec.parse_tensors({"include": "x", "every_seconds": 2})
    assert spec.to_dict()["every_seconds"] == 2.0


def _counts(pool):
    names = ("submitted", "processed", "errors", "abandoned", "restarts", "off")
    return {name: getattr(pool, name) for name in names} | {"failure": pool._first_failure}


@pytest.mark.filterwarnings("ignore:layerscope. on_tensor.*had not finished")
def test_a_worker_terminated_at_close_still_finishes_its_video(tmp_path, monkeypatch):
    import time

    from layerscope.tensors import TensorWorkers, _worker_handle, _workers

    # The worker finishes its file in the grace a terminated worker gets before it is killed;
    # on a loaded machine drawing the frame it holds can take longer than the default second.
    for module in (_worker_handle, _workers):
        monkeypatch.setattr(module, "TERMINATE_GRACE_S", 10.0, raising=False)
    # Spawned, as by default.
    pool = TensorWorkers(Video(Histogram(), "gif"), 1, tmp_path, queue_size=50)
    for step in range(40):
        pool.submit(_record(torch.randn(64), step))
    deadline = time.monotonic() + 120
    while pool.processed < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.processed >= 2, _counts(pool)
    assert not pool.close(timeout=0)  # gives up on the queue: the worker is terminated
    path = tmp_path / "videos" / "histogram" / "blocks.0-activation-out-train.gif"
    assert path.exists(), (_counts(pool), sorted(p.name for p in path.parent.glob("*")))
    assert 2 <= len(gif_frames(path)) < 40
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # a spawned worker imports torch and matplotlib
def test_a_tensor_the_renderer_cannot_draw_is_skipped_and_the_other_videos_stay_whole(tmp_path):
    from layerscope.tensors import PCA

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    # The weight's gradient is a matrix a PCA draws; the bias's is 1-D: no rows to project.
    tensors = {"include": "^0$", "kinds": "weight_grad", "every": 1, "keep": False}
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        scope = layerscope.watch(
            model, run=tmp_path / "run", every=1, tensors=tensors, on_tensor=Video(PCA(), "gif")
        )
        with scope:
            for _ in range(6):
                model(torch.randn(5, 4)).sum().backward()
                scope.step()
            scope.close(timeout=120)  # a worker slow to start on a loaded machine
    skipped = [str(w.message) for w in warned if "skipped a tensor" in str(w.message)]
    assert len(skipped) == 1  # once, though each of the 6 steps skipped it
    assert "PCA cannot draw 0 weight_grad bias (train, shape (8,))" in skipped[0]
    assert not [w for w in warned if "raised" in str(w.message)]  # no worker failed
    folder = tmp_path / "run" / "videos" / "pca"
    assert sorted(path.name for path in folder.iterdir()) == ["0-weight_grad-weight-train.gif"]
    assert len(gif_frames(folder / "0-weight_grad-weight-train.gif")) == 6
