"""Whole tensors of chosen modules, kept by ``layerscope.capture``, read by ``load_capture``.

Values are kept in memory, compact and detached; ``save()`` writes them as safetensors files
with a JSON index (``pip install 'layerscope[capture]'``). ``HeatMap``, ``Histogram`` and
``PCA`` draw them (``pip install 'layerscope[plot]'``): as ``on_tensor`` callbacks that write
PNG files, as figures, and as the frames of ``layerscope.animate``. Importing this package
imports neither safetensors, pandas nor matplotlib.
"""

from layerscope.tensors._capture import Capture
from layerscope.tensors._capture_entry import capture
from layerscope.tensors._frames import (
    TensorFrames as TensorFrames,  # frames()' result; not in __all__
)
from layerscope.tensors._records import Record
from layerscope.tensors._recordset import SavedCapture, load_capture
from layerscope.tensors._render import PCA, HeatMap, Histogram

__all__ = [
    "PCA",
    "Capture",
    "HeatMap",
    "Histogram",
    "Record",
    "SavedCapture",
    "capture",
    "load_capture",
]
