"""Whole tensors of chosen modules, kept by ``layerscope.capture``, read by ``load_capture``.

Values are kept in memory, compact and detached; ``save()`` writes them as safetensors files
with a JSON index (``pip install 'layerscope[capture]'``). Importing this package imports
neither safetensors nor pandas.
"""

from layerscope.tensors._capture import Capture, capture
from layerscope.tensors._records import Record
from layerscope.tensors._recordset import SavedCapture, load_capture

__all__ = ["Capture", "Record", "SavedCapture", "capture", "load_capture"]
