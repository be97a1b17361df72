"""The runs a dashboard may show: those directly under its root folder, found by folder name.

A name from a URL is never joined to a path before it is checked: it must be one plain folder
name (no ``..``, no separator, no NUL) whose real location is inside the root, and a run must be
there. Anything else is ``UnknownRunError``, which the app answers with 404, so a request can read
no file outside the runs under the root. A run that is there but whose ``run.json`` is damaged
is a ``RunFileError``, never hidden as a 404.

What the catalog says of a run's files (a damaged one, one left out) names them relative to the
root: a page never learns where the root is on the server's disk.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope._imports import require
from layerscope.store import (
    MISSING,
    RUN_FILE,
    UNREADABLE,
    Run,
    RunFileError,
    directory_rank,
    holds_run,
    run_folders,
    run_row,
)


class UnknownRunError(LookupError):
    """No run of that name under the root (or a name that could point elsewhere)."""


# What a listed run's row and alert count depend on: (mtime_ns, size, inode) of each file,
# None for a missing one.
Stamp = tuple[int, int, int] | None


@dataclass(frozen=True, slots=True)
class _Listed:
    """A run's entry in the listing, and the state of the files it was read from."""

    run_files: tuple[tuple[str, Stamp], ...]
    entry: dict[str, Any] | None  # None: a rank directory of the run at the root
    alert_files: tuple[tuple[str, Stamp], ...]
    alerts: int | None


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
        self._fs = require("fsspec", "dataframe").filesystem("file")
        self._opened: dict[str, Run] = {}
        self._listed: dict[str, _Listed] = {}
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
            RunFileError: its ``run.json`` is damaged.
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
        """The run ``name`` opened now: its ``meta`` says where a run being written is.

        Raises:
            UnknownRunError: no run is there.
            RunFileError: its ``run.json`` is damaged.
        """
        path = path or self.path(name)
        try:
            return Run(path, within=self.root)
        except RunFileError:
            raise  # a run that is there, damaged: not "no such run"
        except FileNotFoundError as error:
            if holds_run(self._fs, str(path)):  # its run.json lost, its other files there
                raise RunFileError(str(path / RUN_FILE), MISSING) from None
            raise UnknownRunError(name) from error
        except (OSError, ValueError) as error:
            raise UnknownRunError(name) from error

    def listing(self) -> list[dict[str, Any]]:
        """Every run under the root: folder name (the URL's), name, status, steps, alerts...

        A run whose ``run.json`` cannot be read has status ``"unreadable"`` and ``error``, the
        file and field to blame; ``error`` is None for the others. A run read without some
        of its files (a rank's, an alerts segment) has ``skipped``, as the other answers.

        Each entry is kept while the files it was read from are unchanged, so that listing an
        unchanged run costs a few ``stat`` calls; a run marked running is read again each
        time, since the time alone can make it crashed.
        """
        entries = []
        listed = set()
        for name, location in run_folders(self.root):
            try:
                self.path(name)
            except UnknownRunError:
                continue  # a link to a run elsewhere: not served, so not listed
            listed.add(name)
            entry = self._entry(name, location)
            if entry is not None:
                entries.append(entry)
        with self._lock:  # forget runs removed since
            for gone in set(self._listed) - listed:
                del self._listed[gone]
        return entries

    def _entry(self, name: str, location: str) -> dict[str, Any] | None:
        """The listing's entry of the run ``name``, read again only where its files changed."""
        places = _places(self.root / name)
        # Stamped before reading: a file changed meanwhile is read again at the next listing.
        run_files = tuple((place, _stamp(os.path.join(place, RUN_FILE))) for place in places)
        alert_files = tuple(item for place in places for item in _folder_stamps(place, "alerts"))
        with self._lock:
            kept = self._listed.get(name)
        if (
            kept is not None
            and kept.run_files == run_files
            and (kept.entry is None or kept.entry["status"] != "running")
        ):
            entry = kept.entry
        else:
            entry = self._entry_of(run_row(location, name, within=self.root), name)
        alerts = None
        if entry is not None and entry["status"] != UNREADABLE:
            if kept is not None and kept.alert_files == alert_files and kept.alerts is not None:
                alerts = kept.alerts
            else:
                alerts = self._alert_count(name)
        with self._lock:
            self._listed[name] = _Listed(run_files, entry, alert_files, alerts)
        if entry is None:
            return None
        with self._lock:
            opened = self._opened.get(name)
        # The files the run was read without (a rank's, an alerts segment): its counts lack them.
        return self.noted({**entry, "alerts": alerts}, *([opened] if opened else []))

    def _entry_of(self, row: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
        if row is None:
            return None
        error = row["error"]
        return {
            "id": name,
            "name": row["name"],
            "status": row["status"],
            "steps": row["steps"],
            "ranks": row["ranks"],
            "started": row["started"],
            "ended": row["ended"],
            "error": None if error is None else self.hide_root(error),
        }

    def _alert_count(self, name: str) -> int | None:
        try:
            return len(self.run(name).alerts)
        except (UnknownRunError, OSError, ValueError):
            return None  # removed or damaged since it was listed

    # ------------------------------------------------------------------ damaged files

    def relative(self, path: str) -> str:
        """``path`` as the page may see it: relative to the root, never a path outside it."""
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return os.path.basename(path)

    def hide_root(self, text: str) -> str:
        """``text`` with the root's location left out of the paths it names."""
        return text.replace(f"{self.root}{os.sep}", "")

    def damage(self, error: RunFileError) -> dict[str, Any]:
        """What the page is told of a damaged file: the message, the file and the field."""
        file = self.relative(error.path)
        where = f"{file}: {error.field}" if error.field else file
        return {
            "error": f"{where}: {self.hide_root(error.reason)}",
            "file": file,
            "field": error.field,
        }

    def unreadable(self, error: Exception) -> dict[str, Any]:
        """What the page is told of a file that passed the reader's checks but not a read.

        DuckDB's and Arrow's messages name the file, by its full path, where they know it.
        """
        lines = str(error).splitlines()
        message = lines[0] if lines and lines[0] else type(error).__name__
        named = re.search(re.escape(f"{self.root}{os.sep}") + r"[^\s\"']+", message)
        return {
            "error": f"a file of the run cannot be read: {self.hide_root(message)}",
            "file": None if named is None else self.relative(named.group(0)),
            "field": None,
        }

    def noted(self, answer: dict[str, Any], *runs: Run) -> dict[str, Any]:
        """``answer`` with ``skipped``, the files that ``runs`` left out and why, if any."""
        skipped: dict[str, str] = {}
        for run in runs:
            for path, reason in dict(run.skipped).items():  # a copy: other threads add
                skipped.setdefault(path, reason)
        if not skipped:
            return answer
        notes = [
            {"file": self.relative(path), "reason": self.hide_root(reason)}
            for path, reason in sorted(skipped.items())
        ]
        return {**answer, "skipped": notes}


def _places(folder: Path) -> list[str]:
    """The run's folder and its ranks' folders, as the reader finds them."""
    places = [str(folder)]
    try:
        with os.scandir(folder) as entries:
            ranks = [entry.path for entry in entries if directory_rank(entry.name) is not None]
    except OSError:
        return places
    return places + sorted(ranks)


def _stamp(path: str) -> Stamp:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size, status.st_ino


def _folder_stamps(place: str, table: str) -> list[tuple[str, Stamp]]:
    """Each file of a table's folder with its stamp: a file added, removed or replaced shows."""
    folder = os.path.join(place, table)
    try:
        with os.scandir(folder) as entries:
            files = sorted(entry.path for entry in entries)
    except OSError:
        return [(folder, None)]
    return [(path, _stamp(path)) for path in files]
