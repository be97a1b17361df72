"""``Video``: an ``on_tensor`` callback that films each tensor while the run trains.

In its worker process each record is drawn by a renderer (``HeatMap`` by default) and its
frame appended at once to the video of its tensor, one file per (module, kind, tensor,
phase); no frame is kept, so memory stays that of one frame. The worker calls ``close()``
when the run ends (the scope's close stops the workers), which finishes every file and gives
it its name; until then each is written beside it, as ``.<name>.partial.<suffix>``. Each
frame's colour limits and axes are its own tensor's (later values are not known yet); its
caption says the step.

A worker that ends after a failure finishes its files too, and the one started after it goes
on with each tensor's video: ``videos/.<what>.json`` says which file is whose.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from layerscope._imports import require
from layerscope.tensors import _video_index as video_index
from layerscope.tensors._records import Record
from layerscope.tensors._render import PCA, HeatMap, Histogram, safe_name
from layerscope.tensors._skipped import SkippedTensorError
from layerscope.tensors._video_writer import FORMATS, VideoWriter

Renderer = HeatMap | Histogram | PCA
Key = tuple[str, str, str, str]  # module, kind, tensor, phase


class Video:
    """Videos of whole tensors, written by ``on_tensor``'s worker as the tensors come.

    The file of a tensor is ``<directory>/videos/<what>/<module>-<kind>-<tensor>-<phase>``
    ``.mp4`` (or ``.gif``), ``what`` the renderer's (``heatmap``, ``histogram``, ``pca``),
    names made safe as the renderers' PNG files are (``-2`` where two tensors' names would
    meet). A tensor the renderer cannot draw (a ``PCA`` of a 1-D bias) is skipped, with one
    warning naming it. A worker started again after a failure appends to the videos the one
    before it wrote. One worker writes each file, so ``watch`` takes a ``Video`` with
    ``workers=1`` only.

    Args:
        renderer: draws each frame: ``HeatMap()`` (the default), ``Histogram()`` or ``PCA()``.
        format: ``"mp4"`` (needs ffmpeg: ``pip install 'layerscope[video]'``) or ``"gif"``.
        fps: frames per second of the video.

    Examples:
        >>> from layerscope.tensors import Histogram, Video
        >>> Video(Histogram(bins=32), format="gif", fps=4)
        Video(renderer=Histogram(bins=32), format='gif', fps=4)
    """

    def __init__(self, renderer: Renderer | None = None, format: str = "mp4", fps: float = 5):
        if renderer is None:
            renderer = HeatMap()
        if not isinstance(renderer, HeatMap | Histogram | PCA):
            raise TypeError(
                f"renderer: expected a HeatMap, Histogram or PCA, got {type(renderer).__name__}"
            )
        if not isinstance(format, str) or f".{format}" not in FORMATS:
            raise ValueError(f"format: expected 'mp4' or 'gif', got {format!r}")
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not fps > 0:
            raise ValueError(f"fps: expected a positive number, got {fps!r}")
        self.renderer = renderer
        self.format = format
        self.fps = fps
        self._writers: dict[Key, VideoWriter] = {}
        # Tensors the renderer could not draw, and why: skipped at each step, warned of once.
        self._undrawable: dict[Key, str] = {}

    def __repr__(self) -> str:
        return f"Video(renderer={self.renderer!r}, format={self.format!r}, fps={self.fps!r})"

    def __getstate__(self) -> dict[str, Any]:
        # What a worker needs to start: the settings, never open files.
        return {"renderer": self.renderer, "format": self.format, "fps": self.fps}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]  # the checks and an empty set of files

    def __call__(self, record: Record, directory: str | os.PathLike[str] | None) -> Path:
        """Append ``record``'s frame to its tensor's video; the video's final path.

        Raises:
            ValueError: ``directory`` is None (a run in memory has no directory).
            TypeError: ``record`` is not a Record holding a tensor.
            SkippedTensorError: the renderer cannot draw this tensor (a PCA of a bias): its
                worker skips it with one warning, and the other videos go on.
        """
        if not isinstance(record, Record):
            raise TypeError(
                f"record: expected a layerscope.tensors.Record, got {type(record).__name__}"
            )
        if directory is None:
            raise ValueError(
                "directory: Video writes its files into the run directory, and this run has "
                "none (it is in memory, or on an object store): give watch a run= directory "
                "on this machine's disk"
            )
        key = (record.module, record.kind, record.tensor, record.phase)
        if key in self._undrawable:
            raise SkippedTensorError(self._undrawable[key])
        require("matplotlib", "plot")  # missing, a failure of the worker, not of a tensor
        try:
            frame = self._frame(record)
        except Exception as error:  # this tensor cannot be drawn: its video is never begun
            self._undrawable[key] = (
                f"{type(self.renderer).__name__} cannot draw {record.module or 'the model'} "
                f"{record.kind} {record.tensor} ({record.phase}, shape "
                f"{tuple(record.value.shape)}): {type(error).__name__}: {error}"
            )
            raise SkippedTensorError(self._undrawable[key]) from error
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writer_for(key, Path(directory), record)
            self._writers[key] = writer
        writer.append(frame)
        return writer.path

    def close(self) -> None:
        """Finish every video (``on_tensor``'s worker calls it as it ends)."""
        writers, self._writers = list(self._writers.values()), {}
        errors = []
        for writer in writers:
            try:
                writer.close()
            except Exception as error:  # the other files are finished all the same
                errors.append(error)
        if errors:
            raise errors[0]

    def _frame(self, record: Record) -> Any:
        """The record drawn, as a ``(height, width, 4)`` uint8 array of fixed size."""
        require("matplotlib", "plot")
        import numpy as np
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        frames = self.renderer.frames([record])
        canvas = FigureCanvasAgg(frames.figure)
        canvas.draw()  # type: ignore[no-untyped-call]
        return np.array(canvas.buffer_rgba())  # type: ignore[no-untyped-call]

    def _writer_for(self, key: Key, directory: Path, record: Record) -> VideoWriter:
        """The writer of ``key``'s video: on with an earlier worker's, or a new file."""
        folder = directory / "videos" / self.renderer.what
        earlier = video_index.files(folder, f".{self.format}").get(key)
        if earlier is not None:
            return VideoWriter(folder / earlier, self.fps, resume=True)
        path = self._free_path(directory, record)
        video_index.add(folder, path.name, key)
        return VideoWriter(path, self.fps)

    def _free_path(self, directory: Path, record: Record) -> Path:
        folder = directory / "videos" / self.renderer.what
        module = safe_name(record.module) or "root"
        stem = f"{module}-{record.kind}-{safe_name(record.tensor)}-{record.phase}"
        taken = {writer.path for writer in self._writers.values()}
        for number in range(1, 10_000):
            name = stem if number == 1 else f"{stem}-{number}"
            path = folder / f"{name}.{self.format}"
            partial = path.with_name(f".{path.name}.partial{path.suffix}")
            if path not in taken and not path.exists() and not partial.exists():
                return path
        raise FileExistsError(f"directory: no free name for {stem!r} under {str(folder)!r}")
