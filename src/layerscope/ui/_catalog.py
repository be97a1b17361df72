"""The runs a dashboard may show: those directly under its root folder, found by folder name.

A name from a URL is never joined to a path before it is checked: it must be one plain folder
name (no ``..``, no separator, no NUL) whose real location is inside the root, and a run must be
there. Anything else is ``UnknownRunError``, which the app answers with 404, so a request can read
no file outside the runs under the root. A run that is there but whose ``run.json`` is damaged,
or that this user may not read, is a ``RunFileError``, never hidden as a 404.

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
Stamps = tuple[tuple[str, Stamp], ...]


@dataclass(frozen=True, slots=True)
class _Listed:
    """A run's entry in the listing, and the state of the files it was read from."""

    run_files: Stamps
    entry: dict[str, Any] | None  # None: a rank directory of the run at the root
    alert_files: Stamps
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
            RunFileError: its ``run.json`` is damaged, or the run is there but cannot be read
                (this user may not read it, say), the file named; any other error of reading
                it, the run's folder named.
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
        except NotADirectoryError as error:
            raise UnknownRunError(name) from error
        except OSError as error:  # there, but not readable: this user's rights, a failing disk
            where = error.filename if isinstance(error.filename, str) else str(path / RUN_FILE)
            raise RunFileError(where, f"cannot be read: {error.strerror or error}") from None
        except ValueError as error:
            raise UnknownRunError(name) from error
        except Exception as error:  # anything else its files cause: this run's 422, not a 500
            raise RunFileError(str(path), f"cannot be read: {_first_line(error)}") from None

    def listing(self) -> list[dict[str, Any]]:
        """Every run under the root: folder name (the URL's), name, status, steps, alerts...

        A run whose ``run.json`` cannot be read has status ``"unreadable"`` and ``error``, the
        file and field to blame; ``error`` is None for the others. A run read without some
        of its files (a rank's, an alerts segment) has ``skipped``, as the other answers.

        Each entry is kept while the files it was read from are unchanged, so that listing an
        unchanged run costs a few ``stat`` calls; a run marked running is read again each
        time, since the time alone can make it crashed.
        """
        listed = [self.entry(name, location) for name, location in self.folders()]
        return [entry for entry in listed if entry is not None]

    def folders(self) -> list[tuple[str, str]]:
        """(name, location) of each run served, as ``listing`` lists them; the removed forgotten.

        ``listing`` is ``entry`` of each: a server may read each run apart, bounded in time.
        """
        served = []
        for name, location in run_folders(self.root):
            try:
                self.path(name)
            except UnknownRunError:
                continue  # a link to a run elsewhere: not served, so not listed
            served.append((name, location))
        with self._lock:  # forget runs removed since
            for gone in set(self._listed) - {name for name, _ in served}:
                del self._listed[gone]
        return served

    def entry(self, name: str, location: str) -> dict[str, Any] | None:
        """The listing's entry of the run ``name``, read again only where its files changed.

        None for a rank's directory of the run at the root, which is not a run of its own.
        """
        # Stamped before reading: a file changed meanwhile is read again at the next listing.
        run_files, alert_files = self._stamps(name)
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
        return self._shown(name, entry, alerts)

    def kept_entry(self, name: str) -> tuple[bool, dict[str, Any] | None]:
        """Whether ``entry(name)`` would read no file now, and the entry it would give then.

        It would not where the run's files are as when it was last listed and it is not marked
        running. This stats files and reads none: a server may do it for every run at once
        and read, each apart, only the runs that changed.
        """
        with self._lock:
            kept = self._listed.get(name)
        if kept is None or (kept.entry is not None and kept.entry["status"] == "running"):
            return False, None
        run_files, alert_files = self._stamps(name)
        unchanged = kept.run_files == run_files and (
            kept.entry is None
            or kept.entry["status"] == UNREADABLE
            or (kept.alert_files == alert_files and kept.alerts is not None)
        )
        return unchanged, self._shown(name, kept.entry, kept.alerts) if unchanged else None

    def _stamps(self, name: str) -> tuple[Stamps, Stamps]:
        """The stamps of the run's ``run.json`` files, and of its alerts' files."""
        places = _places(self.root / name)
        run_files = tuple((place, _stamp(os.path.join(place, RUN_FILE))) for place in places)
        alert_files = tuple(item for place in places for item in _folder_stamps(place, "alerts"))
        return run_files, alert_files

    def _shown(
        self, name: str, entry: dict[str, Any] | None, alerts: int | None
    ) -> dict[str, Any] | None:
        if entry is None:
            return None
        with self._lock:
            opened = self._opened.get(name)
        # The files the run was read without (a rank's, an alerts segment): its counts lack them.
        return self.noted({**entry, "alerts": alerts}, *([opened] if opened else []))

    def timed_out(self, name: str, reason: str) -> dict[str, Any]:
        """The listing's entry of the run ``name`` whose files took too long to read."""
        return {
            "id": name,
            **dict.fromkeys(("steps", "ranks", "started", "ended", "alerts")),
            "name": name,
            "status": UNREADABLE,
            "error": f"{name}: timed out: {reason}",
        }

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
        except Exception:  # removed or damaged since it was listed: this run's, not the listing's
            return None

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


def _first_line(error: BaseException) -> str:
    """``TypeError: unhashable type: 'dict'``: the error's kind and the first line it says."""
    said = next(iter(str(error).splitlines()), "")
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


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
