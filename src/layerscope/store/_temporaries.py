"""Temporaries a killed writer left: the hidden files ``atomic_write`` renames into place.

``atomic_write`` (see ``_files``) writes ``.<name>.<8 hex digits>.tmp`` next to ``<name>`` and
renames it once written; its own errors remove it, but a kill between the two steps (while
compacting a long run, most likely) leaves it behind for good. Readers never read it; it only
takes space.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from layerscope.store._files import file_names, remove_file
from layerscope.store._layout import (
    CALLS_FILE,
    MODULES_FILE,
    RUN_FILE,
    SEGMENTED_TABLES,
    segment_range,
)
from layerscope.store._objects import is_object_store
from layerscope.store._run_meta import RunFile

# Exactly what atomic_write names a temporary: a user's own hidden files are never touched.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{8}\.tmp$")
_PLACE_FILES = frozenset((RUN_FILE, MODULES_FILE, CALLS_FILE))


def remove_stale_temporaries(fs: Any, place: str) -> list[str]:
    """Remove the temporaries of a rank's files in ``place`` and its table directories.

    Only the temporaries of files a writer makes go: ``run.json``, ``modules.json`` and
    ``calls.parquet`` in ``place``, segments and compacted files in ``stats/``, ``scalars/``
    and ``alerts/``. Nothing else is touched, and rank directories inside ``place`` are not
    entered: each rank's place is cleaned on its own.

    Call it only when no writer of ``place`` is alive: a live writer's temporary is a file it
    is writing, and removing it loses that file. On an object store, where no writer makes a
    temporary (see ``_objects``), nothing is listed.

    Args:
        fs: the fsspec filesystem the run is on.
        place: a rank's directory (the run's root for rank 0).

    Returns:
        The paths removed.

    Examples:
        >>> import fsspec
        >>> fs = fsspec.filesystem("memory")
        >>> fs.pipe({"/doc/stale/stats/.data-000001-000002.parquet.0badcafe.tmp": b"",
        ...          "/doc/stale/stats/seg-000003.parquet": b""})
        >>> remove_stale_temporaries(fs, "/doc/stale")
        ['/doc/stale/stats/.data-000001-000002.parquet.0badcafe.tmp']
        >>> fs.rm("/doc/stale", recursive=True)
    """
    if is_object_store(fs):
        return []
    removed = []
    directories = [(place, _is_place_file)]
    directories += [(f"{place}/{table}", _is_table_file) for table in SEGMENTED_TABLES]
    for directory, belongs in directories:
        for name in _names(fs, directory):
            match = _TEMPORARY.match(name)
            if match is None or not belongs(match.group("name")):
                continue
            path = f"{directory}/{name}"
            try:
                remove_file(fs, path)
            except FileNotFoundError:  # removed by someone else meanwhile: gone all the same
                continue
            removed.append(path)
    return removed


def _names(fs: Any, directory: str) -> list[str]:
    """What ``directory`` holds; nothing if it does not exist (a table never written)."""
    try:
        return sorted(file_names(fs, directory)) if fs.isdir(directory) else []
    except FileNotFoundError:
        return []


def _is_place_file(name: str) -> bool:
    return name in _PLACE_FILES


def _is_table_file(name: str) -> bool:
    return segment_range(name) is not None


def clear_ended_places(fs: Any, places: dict[int, str], ranks: list[dict[str, Any]]) -> None:
    """Remove what killed writers left, in the places no writer holds now.

    A rank that finished, failed or crashed writes nothing more: a temporary there (a
    compaction's, most often: megabytes) and its ``run.json``'s reserve are garbage. A reader
    on read-only storage leaves them. On an object store a writer leaves neither (it uploads
    files under their own names and keeps no reserve): nothing is asked of it there.

    Args:
        fs: the fsspec filesystem of the run.
        places: each rank's directory.
        ranks: the run's ranks as ``Run.meta["ranks"]`` lists them, each with its status.
    """
    status = {entry["rank"]: entry["status"] for entry in ranks}
    for rank, place in places.items():
        if status.get(rank) in ("finished", "failed", "crashed"):
            with contextlib.suppress(OSError):
                remove_stale_temporaries(fs, place)
                RunFile(fs, place).release_reserve()  # a killed writer's
