"""A video written frame by frame: each frame goes to the file as it comes, none is kept.

An MP4 streams its frames to an ffmpeg process (H.264, yuv420p); a GIF is written by Pillow,
each frame quantized to a 256-colour palette of its own (a local colour table) and appended to
the file at once. Either is written beside its final name and renamed by ``close()``, so no
reader sees half a file under that name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

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


class VideoWriter:
    """Frames (each ``(height, width, 4)`` uint8, all of one size) appended to a GIF or an MP4.

    Args:
        path: the file; its suffix, ``.gif`` or ``.mp4``, says which.
        fps: frames per second.
        program: the ffmpeg to write an MP4 with; by default ``ffmpeg_path()``.

    Raises:
        ValueError: another suffix.
        RuntimeError: an MP4 and no ffmpeg.
    """

    def __init__(self, path: str | os.PathLike[str], fps: float, program: str | None = None):
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in FORMATS:
            raise ValueError(f"path: expected a .gif or .mp4 file, got {str(path)!r}")
        self._mp4 = suffix == ".mp4"
        self._program = (program or ffmpeg_path()) if self._mp4 else None
        if self._mp4 and self._program is None:
            raise RuntimeError(
                "path: writing MP4 needs ffmpeg on the PATH or `pip install imageio-ffmpeg`"
            )
        self.fps = fps
        self.frames = 0
        self._partial = self.path.with_name(f".{self.path.name}.partial{self.path.suffix}")
        self._process: subprocess.Popen[bytes] | None = None
        self._file: IO[bytes] | None = None
        self._size: tuple[int, int] | None = None
        self.closed = False

    def append(self, frame: np.ndarray) -> None:
        """Write one frame; the first sets the video's size, and later ones must have it."""
        if self.closed:
            raise RuntimeError("append: the video is closed")
        height, width = frame.shape[:2]
        if self._size is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._size = (height, width)
            self._start(width, height)
        elif self._size != (height, width):
            raise ValueError(
                f"frame: {width} x {height} pixels, and the video's are "
                f"{self._size[1]} x {self._size[0]}"
            )
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.write(frame.tobytes())
        else:
            self._write_gif_frame(frame)
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the file and give it its name; the path, or None if no frame came."""
        if self.closed:
            return self.path if self.frames else None
        self.closed = True
        try:
            if self._process is not None:
                _, errors = self._process.communicate()
                if self._process.returncode:
                    message = errors.decode(errors="replace")[-500:]
                    raise RuntimeError(f"ffmpeg failed: {message}")
            elif self._file is not None:
                self._file.write(b";")  # the GIF trailer
                self._file.close()
            if self.frames:
                self._partial.replace(self.path)
                return self.path
            return None
        finally:
            self._partial.unlink(missing_ok=True)

    def discard(self) -> None:
        """Stop writing and leave no file: what was written is deleted."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._process is not None:
                self._process.kill()
                self._process.communicate()
            elif self._file is not None:
                self._file.close()
        finally:
            self._partial.unlink(missing_ok=True)

    def _start(self, width: int, height: int) -> None:
        if self._program is not None:
            self._process = subprocess.Popen(
                [self._program, "-y", "-loglevel", "error",
                 "-f", "rawvideo", "-pix_fmt", "rgba", "-s", f"{width}x{height}",
                 "-r", f"{self.fps}", "-i", "-",
                 # H.264 in yuv420p, the form every player decodes; even sizes it needs.
                 "-vcodec", "libx264", "-pix_fmt", "yuv420p",
                 "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", os.fspath(self._partial)],
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
        else:
            self._file = open(self._partial, "wb")  # noqa: SIM115  # closed by close()

    def _write_gif_frame(self, frame: np.ndarray) -> None:
        image = require("PIL.Image", "plot")
        gif: Any = require("PIL.GifImagePlugin", "plot")
        # Fast octree: a quarter of the default's time on colourful frames (heat maps), as good.
        quantized = image.fromarray(frame[..., :3]).quantize(256, method=image.Quantize.FASTOCTREE)
        duration = round(1000 / self.fps)
        assert self._file is not None
        if self.frames == 0:
            header, _ = gif.getheader(quantized, info={"loop": 0, "duration": duration})
            self._file.write(b"".join(header))
        # Pillow's documented frame writer; each frame's own palette as its local colour table.
        for chunk in gif.getdata(quantized, duration=duration, include_color_table=True):
            self._file.write(chunk)
