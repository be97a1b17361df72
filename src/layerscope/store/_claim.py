"""Claiming a directory for a run: no run there already, and no files that are not a run's."""

from __future__ import annotations

from typing import Any

from layerscope.store._files import file_names
from layerscope.store._layout import RUN_ENTRIES, RUN_FILE, directory_rank


def check_free(fs: Any, root: str, path: str, place: str) -> None:
    """Raise ``FileExistsError`` if ``place`` (relative to ``root``) holds a run.

    Args:
        fs: the fsspec filesystem.
        root: the run's directory on ``fs``.
        path: the run's path as the user gave it, for messages.
        place: a rank's directory relative to ``root`` ("" for the root).
    """
    where = f"{root}/{place}".rstrip("/")
    if fs.exists(f"{where}/{RUN_FILE}"):
        whose = f" (at {place})" if place else ""
        raise FileExistsError(
            f"run: {path} already holds a run{whose}; layerscope never overwrites "
            f"one. Pass a new directory."
        )


def check_own_directory(fs: Any, root: str, path: str) -> None:
    """Raise ``FileExistsError`` unless the root is new, empty, or only a run's files.

    A run gets a directory of its own: written among a user's files, its compaction and
    a later ``layerscope`` would share the folder with them. Other ranks' files, and what
    a killed writer of this run left, are a run's.
    """
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise FileExistsError(f"run: {path} is a file; pass a directory that is new or empty")
    foreign = sorted(
        name
        for name in file_names(fs, root)
        if name not in RUN_ENTRIES
        and directory_rank(name) is None
        and not name.startswith(".")  # reserve and temporaries of a killed writer
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise FileExistsError(
            f"run: {path} holds files that are not a run's ({shown}); pass a "
            f"directory that is new or empty"
        )
