"""Files where a run is, on a local disk or an object store, for the stages that keep their own.

Whole tensors (``layerscope.tensors``) write their parts into a run's place and list them as
the store does its segments: uploaded whole under the final name on an object store, which
has no folders, renamed into place on a disk. A module of its own, not a name of
``layerscope.store``'s face, for the reason ``locations`` is: that face reads whole tensors.
"""

from layerscope.store._files import file_names, write_bytes
from layerscope.store._objects import is_object_store, make_directory

__all__ = ["file_names", "is_object_store", "make_directory", "write_bytes"]
