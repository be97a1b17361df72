"""``layerscope.animate``: one tensor over steps as a GIF or an MP4.

Here only the arguments are checked; the drawing is in ``layerscope.plots._animation``, imported
when called, so that ``import layerscope`` does not import matplotlib or numpy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope._kinds import Kind

if TYPE_CHECKING:
    from layerscope._scope import Scope
    from layerscope.plots._source import RunTables
    from layerscope.store import Run


def animate(
    run: Run | Scope | str | os.PathLike[str],
    module: str,
    kind: str = "activation",
    what: str = "histogram",
    path: str | os.PathLike[str] | None = None,
    *,
    tensor: str | None = None,
    phase: str = "train",
    steps: Sequence[int] | None = None,
    fps: float = 10.0,
) -> Path:
    """Animate one tensor of a run over its recorded steps, a frame per step.

    ``what="histogram"``: the tensor's log2 magnitude histogram (fractions of its elements),
    the bars moving from step to step, with the step and zero fraction in the title.

    Args:
        run: a ``Run``, its path, or a ``Scope`` (its records so far).
        module: the module's name, as in ``run.modules``.
        kind: ``"activation"``, ``"grad"``, ``"weight"``, ... (one of ``layerscope.Kind``).
        what: what each frame shows; ``"histogram"``.
        path: the file to write, ``.gif`` (Pillow) or ``.mp4`` (ffmpeg, on the PATH or from
            ``imageio-ffmpeg``); default ``<run>/animations/<module>-<kind>-<what>.gif``.
        tensor: which tensor of the module (default: ``out``, or ``weight`` for parameters).
        phase: ``"train"`` or ``"eval"``.
        steps: the recorded steps to show, in this order (default: all of them).
        fps: frames per second.

    Returns:
        The path written.

    Raises:
        ValueError: an argument names something the run does not have (the message names the
            argument), or the run is in memory and ``path`` is not given.
        RuntimeError: ``path`` ends in ``.mp4`` and there is no ffmpeg.

    Example::

        layerscope.animate("runs/mnist", "layers.3", "grad")  # runs/mnist/animations/...gif
    """
    from layerscope.plots import _animation, _video

    if what not in _animation.WHATS:
        raise ValueError(f"what: expected one of {_animation.WHATS}, got {what!r}")
    if not isinstance(module, str):
        raise TypeError(f"module: expected a module name, got {type(module).__name__}")
    kind = kind.value if isinstance(kind, Kind) else kind
    if not isinstance(fps, int | float) or not fps > 0:
        raise ValueError(f"fps: expected a positive number, got {fps!r}")
    tables = _tables(run)
    if path is None:
        target = _animation.default_path(getattr(tables, "path", None), module, kind, what)
    else:
        target = Path(path)
        if target.suffix.lower() not in _video.FORMATS:
            raise ValueError(f"path: expected a name ending in .gif or .mp4, got {str(path)!r}")
    return _animation.histogram_animation(
        tables, module, kind, tensor, phase, steps, target, float(fps)
    )


def _tables(run: Run | Scope | str | os.PathLike[str]) -> RunTables:
    """What the run is read through: a loaded run, a scope's, or the run at a path."""
    from layerscope._scope import Scope
    from layerscope.store import Run, load

    if isinstance(run, Scope):
        return run.plot.run
    if isinstance(run, Run):
        return run
    if isinstance(run, str | os.PathLike):
        return load(run)
    raise TypeError(f"run: expected a Run, a Scope or a run's path, got {type(run).__name__}")
