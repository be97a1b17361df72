"""``layerscope.animate``: one tensor over steps as a GIF or an MP4.

Here only the arguments are checked and the source is read; the drawing is in
``layerscope.plots.animation``, imported when called, so that ``import layerscope`` does not
import matplotlib or numpy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from layerscope.model import Kind
from layerscope.tensors import PCA, HeatMap, Histogram, RecordSet

if TYPE_CHECKING:
    from layerscope.plots import RunTables
    from layerscope.scope._scope import Scope
    from layerscope.store import Run

Renderer = HeatMap | Histogram | PCA
# The what of each renderer, and the renderer each whole-tensor what uses by default.
_WHAT_OF: dict[type[Renderer], str] = {HeatMap: "heatmap", PCA: "pca", Histogram: "values"}


def animate(
    source: Run | Scope | RecordSet | str | os.PathLike[str],
    module: str,
    kind: str = "activation",
    what: str | Renderer = "histogram",
    path: str | os.PathLike[str] | None = None,
    *,
    tensor: str | None = None,
    phase: str = "train",
    steps: Sequence[int] | None = None,
    fps: float = 10.0,
) -> Path:
    r"""Animate one tensor over its recorded steps, a frame per step.

    What each frame shows (``what``):

    - ``"histogram"``: the histogram a run recorded of the tensor (fractions of its
      elements), the bars moving from step to step. A log2 one over log2 |value|, the step
      and zero fraction in the caption; a linear one (``histogram=("linear", lo, hi, bins)``)
      in value units from lo to hi, its open slots as hatched bars beyond each end, ticked
      "< lo" and "≥ hi", their fractions in the caption. Statistics only: ``source`` is a
      run.
    - ``"heatmap"``: the whole tensor as an image, a diverging colour map centred on 0, the
      colour limits +-(largest finite magnitude over all frames); 3-D (batch, seq, hidden)
      shows the first sample, 4-D (N, C, H, W) the first sample's channels as tiles, large
      images are shrunk by block means (see ``layerscope.tensors.HeatMap``).
    - ``"pca"``: the tensor's samples (rows; every position of a 3-D tensor; channels
      averaged over space for 4-D) projected on their top two principal components, ONE
      projection for all frames, fit on the last frame's values, so the points move and the
      axes stay (see ``layerscope.tensors.PCA``).
    - ``"values"``: a histogram of the tensor's values, the same linear bins and y limit in
      every frame, NaN and Inf counted in the title (``layerscope.tensors.Histogram``).
    - a renderer, e.g. ``HeatMap(max_side=256)`` or ``Histogram(bins=32)``, to set its options.

    The whole-tensor ones draw the records of one module, kind, tensor and phase, the first
    call of each step.

    Args:
        source: for ``"histogram"``, a ``Run``, its path, or a ``Scope`` (its records so far).
            For whole tensors, a ``Capture`` (``layerscope.capture``), a ``SavedCapture``
            (``layerscope.load_capture``), or a run, its path or a ``Scope`` that kept whole
            tensors (``watch(tensors=...)``; read through its ``tensors``).
        module: the module's name, as in ``run.modules`` or ``record.module``.
        kind: ``"activation"``, ``"grad"``, ``"weight"``, ... (one of ``layerscope.Kind``).
        what: ``"histogram"``, ``"heatmap"``, ``"pca"``, ``"values"`` or a renderer.
        path: the file to write, ``.gif`` (Pillow) or ``.mp4`` (ffmpeg, on the PATH or from
            ``imageio-ffmpeg``); for a run, by default
            ``<run>/animations/<module>-<kind>-<what>.gif``; a capture needs one.
        tensor: which tensor of the module (default: ``out``, or ``weight`` for parameters;
            for whole tensors, the only one kept if that is not there).
        phase: ``"train"`` or ``"eval"``.
        steps: the recorded steps to show, in this order (default: all of them, in order).
        fps: frames per second.

    Returns:
        The path written.

    Raises:
        ValueError: an argument names something the source does not have (the message names
            the argument: ``what``, ``module``, ``kind``, ``tensor``, ``phase``, ``steps``),
            the run kept no whole tensors for a whole-tensor ``what``, the source is in
            memory or a capture and ``path`` is not given, or ``"pca"`` has fewer than two
            samples or features to fit on.
        TypeError: ``source`` or ``module`` has the wrong type.
        RuntimeError: ``path`` ends in ``.mp4`` and there is no ffmpeg.

    Example::

        layerscope.animate("runs/mnist", "layers.3", "grad")  # runs/mnist/animations/...gif

        with layerscope.capture(model, include=r"^encoder\.2$") as cap:
            for batch in batches:
                train_step(batch)
                cap.step()
        layerscope.animate(cap, "encoder.2", what="heatmap", path="encoder2.gif")
        layerscope.animate(cap, "encoder.2", what="pca", path="encoder2-pca.mp4", fps=5)
    """
    from layerscope.plots import animation

    name, renderer = _what(what, animation.WHATS)
    if not isinstance(module, str):
        raise TypeError(f"module: expected a module name, got {type(module).__name__}")
    kind = kind.value if isinstance(kind, Kind) else kind
    if not isinstance(fps, int | float) or not fps > 0:
        raise ValueError(f"fps: expected a positive number, got {fps!r}")
    target = None
    if path is not None:
        target = Path(path)
        if target.suffix.lower() not in animation.FORMATS:
            raise ValueError(f"path: expected a name ending in .gif or .mp4, got {str(path)!r}")
    if renderer is None:
        if isinstance(source, RecordSet):
            raise ValueError(
                "what: 'histogram' draws the histograms a run recorded; for the values "
                "of captured tensors use what='values'"
            )
        tables = _tables(source)
        if target is None:
            target = animation.default_path(getattr(tables, "path", None), module, kind, name)
        return animation.histogram_animation(
            tables, module, kind, tensor, phase, steps, target, float(fps)
        )
    if target is None and isinstance(source, RecordSet):
        raise ValueError("path: a capture has no run directory; give path= (.gif or .mp4)")
    records, run_path = _whole_tensors(source, name, with_path=target is None)
    if target is None:
        target = animation.default_path(run_path, module, kind, name)
    chosen = animation.tensor_records(records, module, kind, tensor, phase, steps)
    return animation.tensor_animation(renderer.frames(chosen), target, float(fps))


def _what(what: object, whats: Sequence[str]) -> tuple[str, Renderer | None]:
    """``what``'s name and its renderer (None for the statistics' ``"histogram"``)."""
    for renderer_type, name in _WHAT_OF.items():
        if isinstance(what, renderer_type):
            return name, what
        if what == name:
            return name, renderer_type()
    if what == "histogram":
        return "histogram", None
    raise ValueError(
        f"what: expected one of {tuple(whats)} or a renderer of layerscope.tensors "
        f"(HeatMap(), PCA(), Histogram()), got {what!r}"
    )


def _whole_tensors(
    source: Run | Scope | RecordSet | str | os.PathLike[str], what: str, *, with_path: bool
) -> tuple[RecordSet, str | None]:
    """The whole tensors ``source`` holds or kept, and its run directory (None if none).

    A scope's run directory is looked up only ``with_path``: that reads the run.
    """
    from layerscope.scope._scope import Scope
    from layerscope.store import Run, load

    if isinstance(source, RecordSet):
        return source, None
    if isinstance(source, Scope):
        kept = getattr(source, "tensors", None)
        run_path = getattr(source.plot.run, "path", None) if with_path else None
    elif isinstance(source, Run):
        kept, run_path = getattr(source, "tensors", None), source.path
    elif isinstance(source, str | os.PathLike):
        run = load(source)
        kept, run_path = getattr(run, "tensors", None), run.path
    else:
        raise TypeError(
            f"source: expected a Capture, a SavedCapture, a Run, a Scope or a run's path, got "
            f"{type(source).__name__}"
        )
    if not isinstance(kept, RecordSet) or not len(kept):
        raise ValueError(
            f"what: expected one of ('histogram',) for a run that kept no whole tensors; "
            f"what={what!r} draws whole tensors, and this run kept none: pass tensors= to "
            f"layerscope.watch, or keep them with layerscope.capture and animate the capture"
        )
    return kept, run_path


def _tables(source: Run | Scope | str | os.PathLike[str]) -> RunTables:
    """What a run's statistics are read through: a loaded run, a scope's, or a run's path."""
    from layerscope.scope._scope import Scope
    from layerscope.store import Run, load

    if isinstance(source, Scope):
        return source.plot.run
    if isinstance(source, Run):
        return source
    if isinstance(source, str | os.PathLike):
        return load(source)
    raise TypeError(f"source: expected a Run, a Scope or a run's path, got {type(source).__name__}")
