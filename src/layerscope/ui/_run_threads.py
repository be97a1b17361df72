"""The server's work on a run: in threads of its own, a few at once per run, bounded in time.

A run's files are input from anywhere: one may be a named pipe no one writes, a file on a
network filesystem that stopped answering, or a run too big to read in reasonable time. A
thread blocked in such a read cannot be stopped, so three bounds keep one run from taking the
server down:

- its work runs in daemon threads apart from the server's own pool (``DaemonWorkers``), so the
  page, its files and the event loop never wait for a run, and a stuck thread never keeps the
  process alive;
- at most ``per_run`` threads work for one run at once, the rest of its requests waiting for
  one: a run whose reads never end holds that many threads, never more;
- a request waits at most ``deadline`` seconds, queueing included, and is then answered with
  ``RunTimeoutError``; while one of a run's threads has gone on past the deadline, the run's
  next requests get that answer at once, without a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from layerscope.ui._daemon_workers import DaemonWorkers

#: Seconds a request may wait for a run's work. The slowest route over a run of 8 million rows
#: answers in under a second (BENCHMARKS.md, Dashboard): ten times that is a read that is stuck
#: (a pipe, a filesystem that stopped answering), not a slow one.
DEADLINE = 10.0
#: Threads that may work for one run at once: the page asks for a run's summary, scalars,
#: alerts, modules and heat map together.
PER_RUN = 4

Result = TypeVar("Result")


class RunTimeoutError(Exception):
    """A run's work did not finish in time.

    Attributes:
        run: the run's name, as the request gave it.
        reason: what took too long.
    """

    def __init__(self, run: str, reason: str) -> None:
        super().__init__(f"{run}: timed out: {reason}")
        self.run = run
        self.reason = reason


@dataclass
class _RunState:
    """One run's threads at work (id -> when each began, loop time) and requests in line."""

    began: dict[int, float] = field(default_factory=dict)
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    #: Threads whose request gave up on them: stuck, whatever the clock says since they began.
    overdue: set[int] = field(default_factory=set)


class RunThreads:
    """Runs each piece of a run's work in a thread, ``per_run`` at once, within ``deadline``.

    Its state lives on the event loop: ``call`` is awaited there, and each thread hands its
    outcome back to the loop.

    Args:
        deadline: seconds a request may wait, for a free thread and for its work.
        per_run: threads that may work for one run at once.

    Raises:
        ValueError: ``deadline`` or ``per_run`` is not positive.
    """

    def __init__(self, deadline: float = DEADLINE, per_run: int = PER_RUN) -> None:
        if not deadline > 0:
            raise ValueError(f"deadline: expected seconds above 0, got {deadline!r}")
        if per_run < 1:
            raise ValueError(f"per_run: expected 1 or more threads, got {per_run!r}")
        self.deadline = float(deadline)
        self.per_run = per_run
        self._runs: dict[str, _RunState] = {}
        self._ids = itertools.count()
        self._workers = DaemonWorkers("layerscope run reader")

    async def call(self, run: str, work: Callable[[], Result]) -> Result:
        """``work()``'s result, computed in a thread of ``run``'s; its exception raised here.

        Raises:
            RunTimeoutError: no thread of the run was free, or the work did not finish, within
                the deadline; or one of the run's threads has gone on past it.
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + self.deadline
        state = self._runs.setdefault(run, _RunState())
        try:
            await self._free_thread(run, state, until)
        except BaseException:
            self._forget_if_idle(run, state)
            raise
        ident = next(self._ids)
        state.began[ident] = loop.time()
        done: asyncio.Future[Result] = loop.create_future()
        self._workers.submit(lambda: self._work(loop, work, run, state, ident, done))
        try:
            return await asyncio.wait_for(asyncio.shield(done), until - loop.time())
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            if ident in state.began:  # not finished as the deadline came
                state.overdue.add(ident)
            reason = f"reading its files took over {self.deadline:g} s"
            raise RunTimeoutError(run, reason) from None
        finally:
            done.cancel()  # no one awaits it now: its outcome, when it comes, is dropped

    async def _free_thread(self, run: str, state: _RunState, until: float) -> None:
        """Wait until fewer than ``per_run`` threads work for ``run``, none of them stuck."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            stuck = [
                now - began
                for ident, began in state.began.items()
                if ident in state.overdue or now - began > self.deadline
            ]
            if stuck:
                reason = f"a read of its files has gone on for {max(stuck):.1f} s"
                raise RunTimeoutError(run, reason)
            if len(state.began) < self.per_run:
                return
            waiter: asyncio.Future[None] = loop.create_future()
            state.waiting.append(waiter)
            try:
                await asyncio.wait_for(waiter, until - now)
            except BaseException as error:
                with contextlib.suppress(ValueError):
                    state.waiting.remove(waiter)
                if waiter.done() and not waiter.cancelled():
                    self._wake_one(state)  # woken as it gave up: the turn goes to the next
                if isinstance(error, asyncio.TimeoutError):
                    reason = f"{len(state.began)} reads of its files took over {self.deadline:g} s"
                    raise RunTimeoutError(run, reason) from None
                raise

    def _work(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Callable[[], Any],
        run: str,
        state: _RunState,
        ident: int,
        done: asyncio.Future[Any],
    ) -> None:
        """In the thread: do the work, then hand its outcome to the loop, whatever happens."""
        threading.current_thread().name = f"layerscope run {run[:64]}"  # as a stuck one shows
        result: Any = None
        error: Exception | None = None
        try:
            result = work()
        except Exception as caught:  # the request's to answer, on the loop
            error = caught
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
                loop.call_soon_threadsafe(self._finished, run, state, ident, done, result, error)

    def _finished(
        self,
        run: str,
        state: _RunState,
        ident: int,
        done: asyncio.Future[Any],
        result: Any,
        error: Exception | None,
    ) -> None:
        """On the loop: free the thread's place, hand on the outcome, let the next one in."""
        del state.began[ident]
        state.overdue.discard(ident)
        if not done.done():
            if error is None:
                done.set_result(result)
            else:
                done.set_exception(error)
        self._wake_one(state)
        self._forget_if_idle(run, state)

    @staticmethod
    def _wake_one(state: _RunState) -> None:
        while state.waiting:
            waiter = state.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _forget_if_idle(self, run: str, state: _RunState) -> None:
        """Drop a run's state once nothing works or waits for it: names come from URLs."""
        if not state.began and not state.waiting and self._runs.get(run) is state:
            del self._runs[run]
