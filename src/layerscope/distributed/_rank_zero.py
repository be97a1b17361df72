"""A choice rank 0 makes for every rank of a job: a run's directory, say.

Each rank choosing for itself can see what another rank has just begun (rank 0's new run,
already holding its ``run.json``) and choose differently.
"""

from __future__ import annotations

from collections.abc import Callable


def rank_zero_choice(choose: Callable[[], str]) -> str:
    """``choose()`` on rank 0, broadcast to every rank; ``choose()`` alone outside a job.

    An error on rank 0 is raised on every rank, after the broadcast that all reach.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return choose()
    chosen: list[str | BaseException | None] = [None]
    if dist.get_rank() == 0:
        try:
            chosen[0] = choose()
        except Exception as error:  # every rank must still reach the broadcast
            chosen[0] = error
    dist.broadcast_object_list(chosen, src=0)
    choice = chosen[0]
    if isinstance(choice, BaseException):
        raise choice
    if not isinstance(choice, str):
        raise RuntimeError("rank 0 made no choice")
    return choice
