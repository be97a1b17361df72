"""What a rank's ``run.json`` holds when the rank makes its files.

The writer renews ``updated`` and the counters at every flush and sets ``status`` and
``ended`` at close; a reader merges the ranks' files into the run's (see ``_status``).
"""

from __future__ import annotations

import getpass
import os
import platform
import socket
import sys
import time
from typing import Any

import torch

from layerscope.sinks._base import RunInfo
from layerscope.store._layout import SCHEMA_VERSION


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
            "torch": torch.__version__,
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
        "failures": 0,
        "cost_seconds": 0.0,
        "writer_seconds": 0.0,
        "kernel": None,  # set at close: the statistics kernel that ran (see _partials)
    }


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _layerscope_version() -> str:
    from layerscope import __version__

    return __version__
