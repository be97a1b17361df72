"""Which files of one table a reader reads: each rank's, in segment order, the rest named.

A table's files are listed anew at every read, so that a run being written shows its new
segments. A rank's place without a ``run.json`` is not read (whose rows, how many?); a table
folder that is a file, or that this user may not read, is named and left out. On an object
store, where every question is a request, a folder is only listed: one that lists as not found
holds nothing (see ``_objects``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from layerscope.store._files import file_names
from layerscope.store._layout import CALLS_FILE, RUN_FILE, SEGMENTED_TABLES, files_to_read
from layerscope.store._objects import is_object_store
from layerscope.store._segment_checks import SegmentChecks


def table_files(
    fs: Any,
    places: list[tuple[int, str]],
    segments: SegmentChecks,
    table: str,
    skip: Callable[[str, str], object],
) -> tuple[list[str], set[str]]:
    """The paths of ``table``'s files to read in every rank's place, and those without a rank.

    Args:
        fs: the fsspec filesystem of the run.
        places: (rank, directory) of each rank's place.
        segments: the checks of the run's files.
        table: a table of the run, or ``"calls"``.
        skip: told each path left out, and why.

    Returns:
        The paths, and which of them were written before tables had a ``rank`` column.

    Raises:
        FileNotFoundError: a listed file vanished (compacted meanwhile): list again.
    """
    paths: list[str] = []
    rankless: set[str] = set()
    for _, place in places:
        if not segments.has_meta(place):
            # Rows no run.json speaks for: of which rank, how many, written by whom?
            if _holds_tables(fs, place):
                skip(place, f"no {RUN_FILE} there: its files are left out")
            continue
        if table == "calls":
            names = [CALLS_FILE] if fs.exists(f"{place}/{CALLS_FILE}") else []
            directory = place
        else:
            directory = f"{place}/{table}"
            try:
                names = files_to_read(_folder_names(fs, directory, table))
            except _FolderLeftOutError as left_out:
                skip(directory, str(left_out))
                continue
        listing = segments.listing(place, table, directory, names)
        for path, reason in listing.skipped:
            skip(path, reason)
        rankless |= listing.rankless
        paths += listing.paths
    return paths, rankless


class _FolderLeftOutError(Exception):
    """A table folder not read, and why."""


def _folder_names(fs: Any, directory: str, table: str) -> list[str]:
    """The names in the table folder ``directory``; none where there is none.

    Raises:
        _FolderLeftOutError: it is a file, or this user may not read it.
    """
    if not is_object_store(fs):
        if not fs.exists(directory):
            return []
        if not fs.isdir(directory):
            raise _FolderLeftOutError(f"a file where the {table} folder should be")
    try:
        return file_names(fs, directory)
    except PermissionError:
        raise _FolderLeftOutError("this user may not read this folder: left out") from None


def _holds_tables(fs: Any, place: str) -> bool:
    """Whether ``place`` holds any table of a run (rank directories aside)."""
    tables = [f"{place}/{table}" for table in SEGMENTED_TABLES]
    return any(fs.exists(path) for path in [*tables, f"{place}/{CALLS_FILE}"])
