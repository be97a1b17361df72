"""A run's status: each rank's from its ``run.json`` and heartbeat, the run's from all of them.

A rank marked running may have died without a word (a kill, a lost host): its ``updated``
time, renewed at every flush, tells it on any host, and its pid on its own host.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

# A run marked running whose ``run.json`` was not renewed for this long, and for ten of its
# heartbeats, is taken for one that died: on another host its process cannot be asked.
_MIN_SILENCE_SECONDS = 60.0
_HEARTBEATS_MISSED = 10
# The order in which ranks' statuses win the run's: one rank that crashed makes a crashed run.
_STATUS_ORDER = ("crashed", "failed", "running")
# Each rank's counters, kept with its summary: a job's cost is every rank's.
RANK_COUNTERS = (
    "recorded_rows", "written_rows", "dropped_rows", "written_scalars", "dropped_scalars",
    "failures", "cost_seconds", "writer_seconds",
)  # fmt: skip
# The largest pid POSIX's pid_t (a signed 32-bit int) holds.
_PID_MAX = 2**31 - 1


def combine_metas(metas: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The run's meta from each rank's ``run.json``, by rank.

    Returns:
        The lowest rank's ``run.json`` with ``ranks``, a summary of each rank's (``rank``,
        ``status``, ``steps``, ``host``, ``pid``, ``updated`` and its ``RANK_COUNTERS``), and
        ``status`` the run's.
    """
    meta = dict(metas[min(metas)])
    ranks: list[dict[str, Any]] = []
    for rank, rank_meta in sorted(metas.items()):
        ranks.append(
            {
                "rank": rank,
                "status": _status(rank_meta),
                "steps": rank_meta.get("steps"),
                "host": rank_meta.get("host"),
                "pid": rank_meta.get("pid"),
                "updated": rank_meta.get("updated"),
                **{name: rank_meta.get(name) for name in RANK_COUNTERS},
            }
        )
    meta["status"] = _combined([entry["status"] for entry in ranks])
    meta["ranks"] = ranks
    return meta


def _status(meta: dict[str, Any]) -> str:
    """The saved status, or ``"crashed"`` for a run marked running whose process is gone.

    A process is gone when its heartbeat (``updated``, renewed at every flush) is older than
    ten heartbeats and a minute, on any host; or, on this host, when its pid is gone.
    """
    status = str(meta.get("status", "unknown"))
    if status != "running":
        return status
    updated, beat = meta.get("updated"), meta.get("heartbeat_seconds")
    if isinstance(updated, int | float) and isinstance(beat, int | float):
        silence = max(_MIN_SILENCE_SECONDS, _HEARTBEATS_MISSED * beat)
        if time.time() - updated > silence:
            return "crashed"
    pid = meta.get("pid")
    # Only a pid this host's pid_t holds is asked about: a larger one (a Windows host's, one
    # of a damaged file) names no process here, and os.kill would raise OverflowError.
    if (
        meta.get("host") != socket.gethostname()
        or not isinstance(pid, int)
        or not 0 < pid <= _PID_MAX
    ):
        return status
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "crashed"
    except (OSError, OverflowError):  # another user's process (EPERM): it lives
        pass
    return status


def _combined(statuses: list[str]) -> str:
    """The run's status from its ranks': the first of crashed, failed, running any has."""
    for status in _STATUS_ORDER:
        if status in statuses:
            return status
    return "finished" if all(s == "finished" for s in statuses) else statuses[0]
