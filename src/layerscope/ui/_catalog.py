"""The runs a dashboard may show: those directly under its root folder, found by folder name.

A name from a URL is never joined to a path before it is checked: it must be one plain folder
name (no ``..``, no separator, no NUL) whose real location is inside the root, and a run must be
there. Anything else is ``UnknownRunError``, which the app answers with 404, so a request can read
no file outside the runs under the root.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

from layerscope.store import Run, load, runs


class UnknownRunError(LookupError):
    """No run of that name under the root (or a name that could point elsewhere)."""


class RunCatalog:
    """The runs under ``root``, each opened once and kept for its SQL connection.

    Args:
        root: a local folder of runs.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"root: no folder at {os.fspath(root)}")
        self._opened: dict[str, Run] = {}
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        """The folder of the run ``name``, checked to be one plain name inside the root.

        Raises:
            UnknownRunError: for any other name.
        """
        plain = (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and "/" not in name
            and "\\" not in name
            and "\x00" not in name
            and os.path.basename(name) == name
        )
        if not plain:
            raise UnknownRunError(name)
        path = self.root / name
        # A symbolic link inside the root may point anywhere: follow it and look where it lands.
        if path.resolve().parent != self.root or not path.is_dir():
            raise UnknownRunError(name)
        return path

    def run(self, name: str) -> Run:
        """The run ``name``, opened at its first use and kept: reuse keeps its DuckDB database.

        Its ``meta`` is the one read when it was opened: ``fresh`` reads the current one.

        Raises:
            UnknownRunError: no run is there.
        """
        path = self.path(name)
        with self._lock:
            opened = self._opened.get(name)
        if opened is not None:
            return opened
        opened = self.fresh(name, path)
        with self._lock:
            return self._opened.setdefault(name, opened)

    def fresh(self, name: str, path: Path | None = None) -> Run:
        """The run ``name`` opened now: its ``meta`` says where a run being written is."""
        try:
            return load(path or self.path(name))
        except (OSError, ValueError) as error:
            raise UnknownRunError(name) from error

    def listing(self) -> list[dict[str, Any]]:
        """Every run under the root: its folder name (the URL's), name, status, steps, alerts."""
        listed = runs(self.root)
        entries = []
        for record in listed.to_dict("records"):
            folder = os.path.basename(str(record["path"]).rstrip("/"))
            try:
                self.path(folder)
            except UnknownRunError:
                continue  # a link to a run elsewhere: not served, so not listed
            try:
                alerts: int | None = len(self.run(folder).alerts)
            except (UnknownRunError, OSError, ValueError):
                alerts = None  # removed or damaged since it was listed
            entries.append(
                {
                    "id": folder,
                    "name": _plain(record["name"]),
                    "status": _plain(record["status"]),
                    "steps": _plain(record["steps"]),
                    "ranks": _plain(record["ranks"]),
                    "started": _seconds(record["started"]),
                    "ended": _seconds(record["ended"]),
                    "alerts": alerts,
                }
            )
        return entries


def _plain(value: Any) -> Any:
    """A value of a DataFrame record as JSON takes it: None for missing, Python numbers."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    return value


def _seconds(value: Any) -> float | None:
    """A pandas Timestamp as Unix seconds; None for NaT (not equal to itself) or None."""
    if value is None or value != value:
        return None
    return float(value.timestamp())
