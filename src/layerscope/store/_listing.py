"""Listing runs: ``runs(root)`` gives a DataFrame of the runs directly under a folder.

A folder is a shared place: one run with a damaged ``run.json`` must not hide the others, so
it is listed too, as ``unreadable`` with the reason, and the rest are listed as they are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope._imports import require
from layerscope.store._layout import (
    CALLS_FILE,
    MODULES_FILE,
    RUN_FILE,
    SEGMENTED_TABLES,
    directory_rank,
    segment_range,
)
from layerscope.store._objects import is_object_store
from layerscope.store._reader import Run
from layerscope.store.locations import ListedFolder, location_filesystem

if TYPE_CHECKING:
    import pandas

UNREADABLE = "unreadable"
MISSING = "missing, though the folder holds a run's other files"
COLUMNS = ("name", "path", "status", "steps", "ranks", "started", "ended", "error")


def runs(
    root: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> pandas.DataFrame:
    """The runs directly under ``root``: name, path, status, steps, ranks, started, ended, error.

    ``ranks`` counts the ranks that wrote files. A run's rank directories are not runs.
    A run whose ``run.json`` cannot be read is listed too, with status ``"unreadable"``, its
    folder's name for ``name``, nothing (NA, NaT) in ``steps``, ``ranks``, ``started`` and
    ``ended``, and in ``error`` why: the file and the field to blame, as ``RunFileError``
    says it. ``error`` is None for the others. ``steps`` and ``ranks`` are nullable integers
    (``Int64``), so that an unreadable run leaves the others' counts integers.

    Raises:
        TypeError: ``root`` is not a path or URL.
        FileNotFoundError: there is no ``root``.
        NotADirectoryError: ``root`` is a file.

    Example::

        listed = layerscope.runs("runs")
        listed[listed["status"] == "unreadable"][["name", "error"]]
    """
    pandas = require("pandas", "dataframe")
    folders = run_folders(root, storage_options)
    rows = [row for name, location in folders if (row := run_row(location, name))]
    frame = pandas.DataFrame(rows, columns=list(COLUMNS))
    for column in ("steps", "ranks"):
        frame[column] = frame[column].astype("Int64")
    for column in ("started", "ended"):
        frame[column] = pandas.to_datetime(frame[column], unit="s")
    # None, not NaN, where there is no error (a column of strings would make it NaN).
    frame["error"] = pandas.Series([row["error"] for row in rows], dtype=object)
    return frame


def run_folders(
    root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(name, location) of each folder directly under ``root`` that holds a run.

    A run is a folder with a ``run.json`` of its own or of a rank's, or one whose ``run.json``
    was lost but that holds a run's other files: the listing names it as unreadable. A
    location on another filesystem is its URL, a ``ListedFolder`` that opens where it was
    found, whatever its name (``a::b`` reads as no fsspec chain).

    Raises:
        TypeError, FileNotFoundError, NotADirectoryError: as ``runs``.
    """
    if not isinstance(root, str | os.PathLike):
        raise TypeError(f"root: expected the path or URL of a folder, got {type(root).__name__}")
    # A path, never a pattern or an fsspec chain.
    fs, base = location_filesystem(root, storage_options=storage_options)
    if not fs.exists(base):
        if is_object_store(fs) and fs.exists(base.split("/", 1)[0]):
            return []  # a prefix with no files, in a bucket that is there
        raise FileNotFoundError(f"root: no folder at {os.fspath(root)}")
    if not fs.isdir(base):
        raise NotADirectoryError(f"root: {os.fspath(root)} is a file, not a folder of runs")
    local = fs.protocol in ("file", ("file", "local"))
    folders = []
    for entry in sorted(fs.ls(base, detail=False)):
        directory = entry.rstrip("/")
        if not holds_run(fs, directory):
            continue
        name = directory.rsplit("/", 1)[-1]
        url = f"{os.fspath(root).rstrip('/')}/{name}"  # shown; opened where it was found
        folders.append((name, entry if local else ListedFolder(url, fs, directory)))
    return folders


def run_row(location: str, name: str, within: Path | None = None) -> dict[str, Any] | None:
    """The row of ``runs`` of the run at ``location`` (folder ``name``), times in seconds.

    None for the directory of a rank of the run at the root, which is not a run of its own.
    ``within``: a folder the run's files must be in, links followed (see ``Run``). Besides
    ``COLUMNS``, ``alerts``: the alerts a run of one rank wrote, as its ``run.json`` counts
    them; None for a run of several ranks (one rank's ``run.json`` may be lost or a copy: its
    files are to be read), one from before that count, or an unreadable one.
    """
    rank = directory_rank(name)
    try:
        run = Run(location, within=within)
        meta = run.meta
        if rank is not None and meta.get("rank") == rank:
            return None
        return {
            "name": meta.get("name"),
            "path": location,
            "status": meta.get("status"),
            "steps": meta.get("steps"),
            "ranks": len(meta["ranks"]),
            "started": meta.get("started"),
            "ended": meta.get("ended"),
            "error": None,
            "alerts": meta.get("written_alerts") if run.rank_folders == 0 else None,
        }
    # Any error at all: one run that cannot be read is its own row, never the folder's failure.
    except Exception as error:
        if rank is not None:
            return None  # a rank's own run.json: the reader of its run names it
        return {
            **dict.fromkeys((*COLUMNS, "alerts")),
            "name": name,
            "path": location,
            "status": UNREADABLE,
            "error": unreadable_reason(location, error),
        }


def unreadable_reason(location: str, error: Exception) -> str:
    """Why the run at ``location`` cannot be read, as its row in the listing says it."""
    if isinstance(error, FileNotFoundError):  # a run's files, but no run.json
        return f"{location}/{RUN_FILE}: {MISSING}"
    if isinstance(error, OSError | ValueError):  # RunFileError names the file and field
        return str(error)
    first = next(iter(str(error).splitlines()), "")
    return f"{location}: cannot be read: {type(error).__name__}: {first}".rstrip(": ")


def holds_run(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds a run, or what is left of one.

    A run has a ``run.json`` of its own or of one of its ranks; one whose ``run.json`` was
    lost still has a run's other files (``modules.json``, ``calls.parquet``, a table's
    segments).
    """
    try:
        if fs.exists(f"{directory}/{RUN_FILE}"):
            return True
        if not fs.isdir(directory):
            return False
        listed = [path.rstrip("/") for path in fs.ls(directory, detail=False)]
        names = {path.rsplit("/", 1)[-1]: path for path in listed}
        return (
            any(
                directory_rank(name) is not None and fs.exists(f"{path}/{RUN_FILE}")
                for name, path in names.items()
            )
            or MODULES_FILE in names
            or CALLS_FILE in names
            or any(
                table in names and fs.isdir(names[table]) and _holds_segments(fs, names[table])
                for table in SEGMENTED_TABLES
            )
        )
    except OSError:  # a folder this user may not read (lost+found): no run of theirs
        return False


def _holds_segments(fs: Any, folder: str) -> bool:
    names = (path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(folder, detail=False))
    return any(segment_range(name) is not None for name in names)
