"""This process's place in a distributed job: its rank and the world size, taken when needed.

A rank read once at ``watch()`` is wrong for a model watched before ``init_process_group``.
So it is asked for when something first needs it (the store's first files, the first rows),
and fixed from then on: rows and files of one process never change rank mid-run.
"""

from __future__ import annotations

import os
import threading

import torch


class ProcessRank:
    """Rank and world size of this process, fixed the first time they are needed.

    ``torch.distributed`` answers once its default group is up; before that, the launcher's
    environment does (torchrun sets ``RANK`` and ``WORLD_SIZE`` before the script starts). A
    process with neither is rank 0 of 1 once fixed.

    Examples:
        >>> place = ProcessRank()
        >>> place.fix()  # no process group, no launcher
        (0, 1)
        >>> place.rank, place.world_size
        (0, 1)
    """

    def __init__(self) -> None:
        self._fixed: tuple[int, int] | None = None
        self._lock = threading.Lock()  # the training and the writer thread may both ask

    def peek(self) -> tuple[int, int] | None:
        """(rank, world size) if fixed or known now, without fixing it; None if unknown."""
        return self._fixed or _known()

    def fix(self) -> tuple[int, int]:
        """(rank, world size), fixed from now on."""
        with self._lock:
            if self._fixed is None:
                self._fixed = _known() or (0, 1)
            return self._fixed

    @property
    def rank(self) -> int:
        """This process's rank, fixed from now on."""
        return self.fix()[0]

    @property
    def world_size(self) -> int:
        """How many processes the job has, fixed from now on."""
        return self.fix()[1]

    def __repr__(self) -> str:
        return f"ProcessRank({self._fixed or 'not fixed yet'})"


def _known() -> tuple[int, int] | None:
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank()), int(distributed.get_world_size())
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world)
        except ValueError:
            return None
    return None
