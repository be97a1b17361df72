"""Frames (RGBA arrays) to files: a GIF by Pillow, an MP4 by ffmpeg.

An MP4 streams its frames to ffmpeg as they come (``layerscope.tensors.VideoWriter``, which
``on_tensor``'s ``Video`` uses too); a GIF of an animation keeps them in memory until written,
each reduced to a 256-colour palette (about 150 KB a frame of 512 x 288), so that Pillow can
merge what frames share.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope._imports import require

if TYPE_CHECKING:
    import numpy as np

FORMATS = (".gif", ".mp4")


def ffmpeg_path() -> str | None:
    """The ffmpeg program: on the PATH, else the one ``imageio-ffmpeg`` ships; None if neither."""
    # Imported here: the tensors package imports torch, which reading a run does not need.
    from layerscope.tensors import ffmpeg_path as find_ffmpeg

    return find_ffmpeg()


def write_video(frames: Iterable[np.ndarray], path: Path, fps: float) -> None:
    """Write ``frames`` (each ``(height, width, 4)`` uint8) to ``path``, GIF or MP4 by suffix.

    Written beside the target and renamed: no half-written file under the final name.

    Raises:
        RuntimeError: an MP4 and no ffmpeg.
    """
    mp4 = path.suffix.lower() == ".mp4"
    program = ffmpeg_path() if mp4 else None
    if mp4 and program is None:
        raise RuntimeError(
            "path: writing MP4 needs ffmpeg on the PATH or `pip install imageio-ffmpeg`"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if program is not None:
        from layerscope.tensors import VideoWriter

        writer = VideoWriter(path, fps, program)
        try:
            for frame in frames:
                writer.append(frame)
        except BaseException:
            writer.discard()
            raise
        writer.close()
        return
    partial = path.with_name(f".{path.name}.partial{path.suffix}")
    try:
        _write_gif(frames, partial, fps)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def _write_gif(frames: Iterable[np.ndarray], path: Path, fps: float) -> None:
    image = require("PIL.Image", "plot")
    # Fast octree: a quarter of the default's time on colourful frames (heat maps), as good.
    method = image.Quantize.FASTOCTREE
    kept = [image.fromarray(frame[..., :3]).quantize(256, method=method) for frame in frames]
    kept[0].save(
        path,
        format="GIF",
        save_all=True,
        append_images=kept[1:],
        duration=round(1000 / fps),
        loop=0,
    )
