"""Daemon threads that take work from one queue: started as needed, ended after a while idle.

A thread costs about half a millisecond to start and join on a busy machine; the list of runs
reads each run in a thread of its own, so a thread per piece of work would cost more than the
work. Unlike ``concurrent.futures``' threads these are daemon threads, never joined at exit:
one stuck in a read that never ends cannot keep the process from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

#: Seconds a thread waits for work before it ends.
IDLE_SECONDS = 10.0


class DaemonWorkers:
    """Runs each task given to ``submit`` in a daemon thread, an idle one if there is one.

    There is no bound on the threads: a task that never returns keeps its thread, and the
    next task gets another. Bounding the tasks is the caller's part.

    Args:
        name: the threads' name while idle.
        idle_seconds: how long a thread waits for work before it ends.
    """

    def __init__(self, name: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self.name = name
        self._idle_seconds = idle_seconds
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads waiting for work less the tasks queued for them: never below 0.
        self._idle = 0

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task()`` in a thread; it must catch its own exceptions."""
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # an idle thread will take it
        self._tasks.put(task)
        if start:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                task = self._tasks.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # more threads wait than tasks are queued: end this one
                        self._idle -= 1
                        return
                continue  # a task was queued for this thread as it gave up waiting
            task()
            threading.current_thread().name = self.name
            with self._lock:
                self._idle += 1
