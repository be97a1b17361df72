"""RunThreads: a thread its request gave up on counts as stuck at once, whatever the clock says."""

from __future__ import annotations

import asyncio
import threading

import pytest

from layerscope.ui._run_threads import RunThreads, RunTimeoutError


class SlowToStart(RunThreads):
    """Its event loop is slow between a request's arrival and its thread's start, as under load."""

    async def _free_thread(self, run, state, until):
        await super()._free_thread(run, state, until)
        await asyncio.sleep(self.deadline / 2)


def test_the_request_after_one_that_timed_out_is_answered_without_a_thread():
    release = threading.Event()
    started = []

    def stuck() -> None:
        started.append(threading.current_thread().name)
        release.wait(10)

    async def two_requests() -> tuple[str, str]:
        threads = SlowToStart(deadline=0.4, per_run=2)
        with pytest.raises(RunTimeoutError) as first:
            await threads.call("run", stuck)
        # Its thread began a fifth of a second ago, under the deadline: it is stuck all the same.
        with pytest.raises(RunTimeoutError) as second:
            await threads.call("run", stuck)
        return first.value.reason, second.value.reason

    try:
        first, second = asyncio.run(two_requests())
    finally:
        release.set()
    assert first == "reading its files took over 0.4 s"
    assert second.startswith("a read of its files has gone on for ")
    assert len(started) == 1
