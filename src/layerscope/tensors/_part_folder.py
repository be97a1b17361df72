"""Where a rank's whole tensors are written: one part per batch, never over another part.

Each part goes under its final name whole (``store.write_bytes``): on a disk through a hidden
temporary renamed into place, on an object store as one upload that appears complete or not
at all. On an object store no folder is made beforehand: ``tensors/`` is the prefix of the
parts under it (see ``store._objects``).

Parts are numbered by batch after those the folder holds already, as a table's segments are: a
writer in a place that kept parts goes on after them instead of writing over them (a PUT
replaces an object without a word, as a rename replaces a file). One listing at the first part
finds them; a folder that holds nothing, or a prefix with nothing under it, holds none.
"""

from __future__ import annotations

from typing import Any

from layerscope.store.file_access import file_names, make_directory, write_bytes
from layerscope.tensors._parts import part_name, part_number


class PartFolder:
    """A rank's ``tensors`` folder, written one part per batch.

    Args:
        fs: the fsspec filesystem of the run.
        directory: the folder's path on ``fs``.
    """

    def __init__(self, fs: Any, directory: str) -> None:
        self.fs = fs
        self.directory = directory
        self._before: int | None = None  # the last part number there before this writer's

    def write(self, batch: int, payload: bytes) -> str:
        """Write ``payload`` as the part of the ``batch``-th batch (from 1); returns its path.

        A batch whose part was not written (a failed upload) leaves its number unused.

        Raises:
            OSError: the folder cannot be listed, or the part cannot be written.
        """
        if self._before is None:  # the first part: the folder made, what it holds found
            make_directory(self.fs, self.directory)
            numbers = map(part_number, file_names(self.fs, self.directory))
            self._before = max((number for number in numbers if number is not None), default=0)
        path = f"{self.directory}/{part_name(self._before + batch)}"
        write_bytes(self.fs, path, payload)
        return path
