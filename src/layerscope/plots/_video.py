"""Frames (RGBA arrays) to files: a GIF by Pillow, an MP4 by ffmpeg.

An MP4 streams its frames to ffmpeg as they come; a GIF keeps them in memory until written,
each reduced to a 256-colour palette (about 150 KB a frame of 512 x 288).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope._imports import require

if TYPE_CHECKING:
    import numpy as np

FORMATS = (".gif", ".mp4")


def ffmpeg_path() -> str | None:
    """The ffmpeg program: on the PATH, else the one ``imageio-ffmpeg`` ships; None if neither."""
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except RuntimeError:  # the package without a binary for this platform
        return None


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
    partial = path.with_name(f".{path.name}.partial{path.suffix}")
    try:
        if program is not None:
            _write_mp4(frames, partial, fps, program)
        else:
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


def _write_mp4(frames: Iterable[np.ndarray], path: Path, fps: float, program: str) -> None:
    process: subprocess.Popen[bytes] | None = None
    try:
        for frame in frames:
            if process is None:
                height, width = frame.shape[:2]
                process = subprocess.Popen(
                    [program, "-y", "-loglevel", "error",
                     "-f", "rawvideo", "-pix_fmt", "rgba", "-s", f"{width}x{height}",
                     "-r", f"{fps}", "-i", "-",
                     # H.264 in yuv420p, the form every player decodes; even sizes it needs.
                     "-vcodec", "libx264", "-pix_fmt", "yuv420p",
                     "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", os.fspath(path)],
                    stdin=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )  # fmt: skip
            assert process.stdin is not None
            process.stdin.write(frame.tobytes())
    finally:
        if process is not None:
            _, errors = process.communicate()
            if process.returncode:
                raise RuntimeError(f"ffmpeg failed: {errors.decode(errors='replace')[-500:]}")
