"""Whole tensors of chosen modules, kept by ``layerscope.capture``, read by ``load_capture``.

Values are kept in memory, compact and detached, or as ``stash(event)`` or ``stash_value``
returned them; ``save()`` writes tensors as safetensors files with a JSON index, which holds
the other values (``pip install 'layerscope[capture]'``). ``HeatMap``, ``Histogram`` and
``PCA`` draw them (``pip install 'layerscope[plot]'``): as ``on_tensor`` callbacks that write
PNG files, as figures, and as the frames of ``layerscope.animate``; ``Video`` films them as
they come, one MP4 or GIF per tensor written while the run trains. Importing this package
imports neither safetensors, pandas nor matplotlib.
"""

from layerscope.tensors._capture import Capture
from layerscope.tensors._capture_entry import capture
from layerscope.tensors._event import Event
from layerscope.tensors._frames import (
    TensorFrames as TensorFrames,  # frames()' result; not in __all__
)
from layerscope.tensors._in_run import RunTensors
from layerscope.tensors._outlet import TensorOutlet
from layerscope.tensors._part_folder import PartFolder
from layerscope.tensors._parts import DIRECTORY, read_parts
from layerscope.tensors._records import Record
from layerscope.tensors._recordset import RecordSet, SavedCapture, load_capture
from layerscope.tensors._render import PCA, HeatMap, Histogram
from layerscope.tensors._skipped import SkippedTensorError
from layerscope.tensors._spec import TensorsSpec, parse_tensors
from layerscope.tensors._values import SavedObject
from layerscope.tensors._video import Video
from layerscope.tensors._video_writer import (
    VideoWriter as VideoWriter,  # plots' MP4s; not in __all__
)
from layerscope.tensors._video_writer import (
    ffmpeg_path as ffmpeg_path,  # plots' MP4s; not in __all__
)
from layerscope.tensors._workers import TensorWorkers, check_on_tensor

__all__ = [
    "DIRECTORY",
    "PCA",
    "Capture",
    "Event",
    "HeatMap",
    "Histogram",
    "PartFolder",
    "Record",
    "RecordSet",
    "RunTensors",
    "SavedCapture",
    "SavedObject",
    "SkippedTensorError",
    "TensorOutlet",
    "TensorWorkers",
    "TensorsSpec",
    "Video",
    "capture",
    "check_on_tensor",
    "load_capture",
    "parse_tensors",
    "read_parts",
]
