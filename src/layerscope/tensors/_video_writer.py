"""A video written frame by frame: each frame goes to the file as it comes, none is kept.

An MP4 streams its frames to an ffmpeg process (H.264, yuv420p); a GIF is written by Pillow,
each frame quantized to a 256-colour palette of its own (a local colour table) and appended to
the file at once. Either is written beside its final name and renamed by ``close()``, so no
reader sees half a file under that name.

A writer may go on with a video that an earlier one finished (``resume=True``: a worker
started again after its callback failed): a GIF's frames are appended after the earlier ones
(its trailer taken off, put back at close); an MP4's new frames are a second file that
``close()`` joins to the earlier one (ffmpeg's concat demuxer, the frames' times renumbered
at the video's rate: joined as they are, H.264's reordering delay would leave a gap).
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
        resume: go on with the video already at ``path``, if there is one (see above).

    Raises:
        ValueError: another suffix.
        RuntimeError: an MP4 and no ffmpeg.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fps: float,
        program: str | None = None,
        resume: bool = False,
    ):
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
        self._header_due = True  # a GIF's, written before its first frame
        # The video an earlier writer finished, moved aside until this one joins it.
        self._earlier: Path | None = None
        if resume and self.path.is_file():
            size = None if self._mp4 else _finished_gif_size(self.path)
            if self._mp4 or size is not None:
                self._earlier = self.path.with_name(f".{self.path.name}.earlier{suffix}")
                os.replace(self.path, self._earlier)
                self._size = size  # later frames must have the earlier ones' size

    def append(self, frame: np.ndarray) -> None:
        """Write one frame; the first sets the video's size, and later ones must have it."""
        if self.closed:
            raise RuntimeError("append: the video is closed")
        height, width = frame.shape[:2]
        if self._size is not None and self._size != (height, width):
            raise ValueError(
                f"frame: {width} x {height} pixels, and the video's are "
                f"{self._size[1]} x {self._size[0]}"
            )
        if self._process is None and self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._size = (height, width)
            self._start(width, height)
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.write(frame.tobytes())
        else:
            self._write_gif_frame(frame)
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the file and give it its name; the path, or None if no frame came."""
        written = self.frames or self._earlier is not None
        if self.closed:
            return self.path if written else None
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
            if self.frames and self._earlier is not None and self._mp4:
                self._join_mp4s()
            elif self.frames:
                self._partial.replace(self.path)
                if self._earlier is not None:  # the GIF holds the earlier frames too
                    self._earlier.unlink()
            return self.path if written else None
        finally:
            self._partial.unlink(missing_ok=True)
            self._restore_earlier()

    def discard(self) -> None:
        """Stop writing and leave no file of its own: what it wrote is deleted."""
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
            self._restore_earlier()

    def _restore_earlier(self) -> None:
        """The earlier video back under its name, where nothing took its place."""
        if self._earlier is not None and self._earlier.exists() and not self.path.exists():
            os.replace(self._earlier, self.path)

    def _join_mp4s(self) -> None:
        """The earlier MP4 and this one's frames as one file, re-encoded at one rate."""
        assert self._earlier is not None
        assert self._program is not None
        listing = self.path.with_name(f".{self.path.name}.join.txt")
        joined = self.path.with_name(f".{self.path.name}.joined{self.path.suffix}")
        quoted = [
            str(part.resolve()).replace("'", "'\\''") for part in (self._earlier, self._partial)
        ]
        listing.write_text("".join(f"file '{part}'\n" for part in quoted), encoding="utf-8")
        try:
            result = subprocess.run(
                [self._program, "-y", "-loglevel", "error", "-f", "concat", "-safe", "0",
                 "-i", os.fspath(listing), "-vf", f"setpts=N/({self.fps}*TB)",
                 "-vcodec", "libx264", "-pix_fmt", "yuv420p", os.fspath(joined)],
                capture_output=True,
                check=False,
            )  # fmt: skip
            if result.returncode:
                message = result.stderr.decode(errors="replace")[-500:]
                raise RuntimeError(f"ffmpeg could not join the video to the earlier one: {message}")
            os.replace(joined, self.path)
            self._earlier.unlink()
        finally:
            listing.unlink(missing_ok=True)
            joined.unlink(missing_ok=True)

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
            if self._earlier is not None:  # its header and frames, then this writer's frames
                self._file.write(self._earlier.read_bytes()[:-1])  # less its trailer
                self._header_due = False

    def _write_gif_frame(self, frame: np.ndarray) -> None:
        image = require("PIL.Image", "plot")
        gif: Any = require("PIL.GifImagePlugin", "plot")
        # Fast octree: a quarter of the default's time on colourful frames (heat maps), as good.
        quantized = image.fromarray(frame[..., :3]).quantize(256, method=image.Quantize.FASTOCTREE)
        duration = round(1000 / self.fps)
        assert self._file is not None
        if self._header_due:
            self._header_due = False
            header, _ = gif.getheader(quantized, info={"loop": 0, "duration": duration})
            self._file.write(b"".join(header))
        # Pillow's documented frame writer; each frame's own palette as its local colour table.
        for chunk in gif.getdata(quantized, duration=duration, include_color_table=True):
            self._file.write(chunk)


def _finished_gif_size(path: Path) -> tuple[int, int] | None:
    """``(height, width)`` of a GIF that a writer finished (trailer and all); else None."""
    with open(path, "rb") as file:
        head = file.read(10)
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
    if len(head) < 10 or not head.startswith(b"GIF89a") or last != b";":
        return None
    return int.from_bytes(head[8:10], "little"), int.from_bytes(head[6:8], "little")
