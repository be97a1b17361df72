"""What a rank's ``run.json`` holds when the rank makes its files, and its reserve of space.

The writer renews ``updated`` and the counters at every flush and sets ``status`` and
``ended`` at close; a reader merges the ranks' files into the run's (see ``_status``).

On a full disk, ``run.json`` could not be rewritten either (a new copy is written before it
replaces the old), and a run that ended well would read as crashed. So a writer holds a
hidden reserve file next to it while it writes, and gives the reserve up for ``run.json``
when the disk is full (see ``ParquetStore``). An object store has no disk to fill: no reserve
is kept there.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import platform
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from layerscope._version import __version__
from layerscope.store._files import remove_file, write_bytes
from layerscope.store._layout import RUN_FILE, SCHEMA_VERSION, SEGMENTED_TABLES
from layerscope.store._objects import is_object_store

if TYPE_CHECKING:
    from layerscope.sinks import RunInfo

# Hidden, so that readers (which read run.json, modules.json, seg- and data- files) skip it.
RESERVE_FILE = ".run.json.reserve"
# Well above a run.json (a few KiB), so that the space it frees holds a new copy written
# beside the old one; a run.json of a long argv or configuration gets four times its size.
RESERVE_BYTES = 64 * 1024
# Seconds to wait before each further try of the last run.json, when one fails: space freed
# meanwhile (a log rotated, a checkpoint removed) still lets the run say how it ended; 1.5 s
# at most, since a scope closed at exit has only seconds for it.
LAST_WRITE_WAITS = (0.1, 0.2, 0.4, 0.8)


def opening_meta(
    info: RunInfo, *, name: str, rank: int, world_size: int, heartbeat_seconds: float
) -> dict[str, Any]:
    """The contents of ``run.json`` of a rank that is opening its files: status running.

    Args:
        info: what the scope tells its sinks at start.
        name: the run's name.
        rank: the rank writing it; 0 outside a distributed job.
        world_size: how many ranks the job has; 1 outside a distributed job.
        heartbeat_seconds: how often the writer renews ``updated`` while the process lives.
    """
    return {
        "schema": SCHEMA_VERSION,
        "id": info.id,
        "name": name,
        "status": "running",
        "started": info.started,
        "ended": None,
        "updated": time.time(),
        # How often ``updated`` is renewed while the process lives: a reader takes a
        # run whose heartbeat stopped for long for one that crashed.
        "heartbeat_seconds": heartbeat_seconds,
        "user": _user(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "rank": rank,
        "world_size": world_size,
        "versions": {
            "python": platform.python_version(),
            "torch": _torch_version(),
            "layerscope": _layerscope_version(),
        },
        "argv": list(sys.argv),
        "config": info.config,
        "histogram_edges": info.histogram_edges,
        "steps": 0,
        # Rows of the stats table; scalars are counted apart.
        "recorded_rows": 0,
        "written_rows": 0,
        "dropped_rows": 0,
        "written_scalars": 0,
        "dropped_scalars": 0,
        "written_alerts": 0,  # so that a listing counts them without reading their files
        "failures": 0,
        "cost_seconds": 0.0,
        "writer_seconds": 0.0,
        "kernel": None,  # set at close: the statistics kernel that ran (see _partials)
        # The last step of each table's rows on disk, or None: after a full disk or a kill,
        # the tables may end at different steps.
        **{last_step_field(table): None for table in SEGMENTED_TABLES},
    }


def last_step_field(table: str) -> str:
    """The ``run.json`` field of the last step of ``table`` on disk: ``stats_last_step``..."""
    return f"{table}_last_step"


class RunFile:
    """A rank's ``run.json``, written so that a full disk still lets it say how the run ended.

    The reserve is a hidden file of ``RESERVE_BYTES`` beside ``run.json``. When ``run.json``
    cannot be written, the reserve is removed and ``run.json`` written again in the space it
    freed; the writer makes it again (``hold_reserve``) before it writes rows, so that rows
    never take that space.

    Args:
        fs: the fsspec filesystem the run is on.
        place: the rank's directory.
    """

    def __init__(self, fs: Any, place: str) -> None:
        self.fs = fs
        self.place = place
        self.reserved = False  # whether the reserve is there, made by this writer
        self._largest = 0  # bytes of the largest run.json written

    def write(self, meta: dict[str, Any]) -> None:
        """Write ``meta`` as ``run.json``; if that fails, give up the reserve and try again."""
        payload = json.dumps(meta, indent=1, default=str).encode()
        path = f"{self.place}/{RUN_FILE}"
        self._largest = max(self._largest, len(payload))
        try:
            write_bytes(self.fs, path, payload)
        except OSError:
            if not self.reserved:
                raise
            with contextlib.suppress(OSError):  # the write below says what is wrong
                self.release_reserve()
            write_bytes(self.fs, path, payload)

    def write_last(self, meta: dict[str, Any]) -> None:
        """Write ``meta`` as ``run.json``, trying again after each of ``LAST_WRITE_WAITS``.

        Raises:
            OSError: the last try failed too.
        """
        for wait in LAST_WRITE_WAITS:
            try:
                self.write(meta)
                return
            except OSError:
                time.sleep(wait)
        self.write(meta)

    def hold_reserve(self) -> None:
        """Make the reserve, unless it is there; nothing of it stays if that fails.

        On an object store there is nothing to hold: ``run.json`` always has room there.

        Raises:
            OSError: no room for it (or the place is not writable).
        """
        if self.reserved or is_object_store(self.fs):
            return
        path = f"{self.place}/{RESERVE_FILE}"
        try:
            with self.fs.open(path, "wb", autocommit=True) as file:
                # Random bytes: a compressing or deduplicating filesystem stores zeros in nothing.
                file.write(os.urandom(max(RESERVE_BYTES, 4 * self._largest)))
        except BaseException:
            with contextlib.suppress(OSError):  # the error that matters is the one raised
                remove_file(self.fs, path)
            raise
        self.reserved = True

    def release_reserve(self) -> None:
        """Remove the reserve, if it is there (also one a killed writer left in this place)."""
        self.reserved = False
        if is_object_store(self.fs):  # none is kept there: no request to make
            return
        with contextlib.suppress(FileNotFoundError):
            remove_file(self.fs, f"{self.place}/{RESERVE_FILE}")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _layerscope_version() -> str:
    return __version__


def _torch_version() -> str:
    import torch  # loaded already: a run is opened by a scope; readers never come here

    return str(torch.__version__)
