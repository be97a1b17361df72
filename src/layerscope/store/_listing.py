"""Listing runs: ``runs(root)`` gives a DataFrame of the runs directly under a folder."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from layerscope._imports import require
from layerscope.store._damage import warn_damaged
from layerscope.store._layout import RUN_FILE, directory_rank
from layerscope.store._reader import Run

if TYPE_CHECKING:
    import pandas


def runs(root: str | os.PathLike[str]) -> pandas.DataFrame:
    """The runs directly under ``root``: name, path, status, steps, ranks, started, ended.

    ``ranks`` counts the ranks that wrote files. A run's rank directories are not runs.

    Raises:
        TypeError: ``root`` is not a path or URL.
        FileNotFoundError: there is no ``root``.
        NotADirectoryError: ``root`` is a file.

    Example::

        layerscope.runs("runs")
    """
    if not isinstance(root, str | os.PathLike):
        raise TypeError(f"root: expected the path or URL of a folder, got {type(root).__name__}")
    pandas = require("pandas", "dataframe")
    fsspec = require("fsspec", "dataframe")
    fs, base = fsspec.core.url_to_fs(os.fspath(root))
    if not fs.exists(base):
        raise FileNotFoundError(f"root: no folder at {os.fspath(root)}")
    if not fs.isdir(base):
        raise NotADirectoryError(f"root: {os.fspath(root)} is a file, not a folder of runs")
    rows = []
    for entry in sorted(fs.ls(base, detail=False)):
        if not _holds_run(fs, entry.rstrip("/")):
            continue
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        local = fs.protocol in ("file", ("file", "local"))
        location = entry if local else f"{os.fspath(root).rstrip('/')}/{name}"
        try:
            meta = Run(location).meta
        except (OSError, ValueError) as error:
            warn_damaged(location, error)
            continue
        rank = directory_rank(name)
        if rank is not None and meta.get("rank") == rank:
            continue  # the directory of a rank of the run at root, not a run
        rows.append(
            {
                "name": meta.get("name"),
                "path": location,
                "status": meta.get("status"),
                "steps": meta.get("steps"),
                "ranks": len(meta["ranks"]),
                "started": pandas.to_datetime(meta.get("started"), unit="s"),
                "ended": pandas.to_datetime(meta.get("ended"), unit="s"),
            }
        )
    columns = ["name", "path", "status", "steps", "ranks", "started", "ended"]
    return pandas.DataFrame(rows, columns=columns)


def _holds_run(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds a run: a ``run.json`` of its own or of one of its ranks."""
    if fs.exists(f"{directory}/{RUN_FILE}"):
        return True
    if not fs.isdir(directory):
        return False
    return any(
        directory_rank(path.rstrip("/").rsplit("/", 1)[-1]) is not None
        and fs.exists(f"{path.rstrip('/')}/{RUN_FILE}")
        for path in fs.ls(directory, detail=False)
    )
