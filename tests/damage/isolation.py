"""Reading a damaged run within bounds: of time for every reader, of memory and of rights for
the cases that ask for it.

A reader that blocks (on a named pipe, say) is given ``READER_SECONDS``; then every named pipe
under the case's folder is opened for writing and closed, so that the reader meets the end of
the file and its thread ends, and its outcome is ``hang``: a bad outcome, not a stuck test.

A reader that could read without bound (``/dev/zero`` as a file) reads in a process of its own
whose address space is capped at ``MEMORY_BYTES``; one that must read as a user other than root
(a file this user may not read means nothing to root) reads in a process that, when this one
is root, drops to ``NOBODY``: after it has read a good run through every reader as root, so
that what it imports on the way (Python itself may be where only root reads) is in already.
The process (``reader_process.py``) reads one job after another and is started again after
one it did not finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import select
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: Seconds a reader is given (``DAMAGE_READER_SECONDS`` to change it); the slowest reading of a
#: healthy case takes about one.
READER_SECONDS = float(os.environ.get("DAMAGE_READER_SECONDS", "20"))
#: The address space of a reading process: room for torch, DuckDB and a run, not for more.
MEMORY_BYTES = 4 << 30
#: The user (and group) a reading process drops to when it must read as a user who is not root.
NOBODY = 65534
_CHILD = Path(__file__).with_name("reader_process.py")


def bounded(read: Callable[[], Any], folder: Path, hung: Callable[[str], Any]) -> Any:
    """``read()``, or ``hung(why)`` if it has not returned in ``READER_SECONDS``.

    What ``read`` raises is raised here (a reader's failures are readings of their own).
    """
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((read(), None))
        except BaseException as error:  # raised again in the caller's thread
            box.append((None, error))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(READER_SECONDS)
    if not thread.is_alive():
        value, error = box[0]
        if error is not None:
            raise error
        return value
    waited = time.monotonic() + 5.0
    while thread.is_alive() and time.monotonic() < waited:
        release_fifos(folder)
        thread.join(0.1)
    return hung(f"no answer in {READER_SECONDS:.0f} s")


def release_fifos(folder: Path) -> None:
    """Open every named pipe under ``folder`` for writing and close it: a reader blocked
    opening one goes on, and finds it empty."""
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(path.lstat().st_mode):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def is_root() -> bool:
    return os.geteuid() == 0


def open_to_all(path: Path) -> None:
    """``path`` and what it holds readable by any user, folders also writable (a reader's
    working directory): for a process that reads as ``NOBODY``."""
    for place in [path, *path.rglob("*")]:
        if place.is_symlink():
            continue
        mode = place.stat().st_mode
        place.chmod(0o777 if stat.S_ISDIR(mode) else (mode | 0o444))


def restore_rights(path: Path) -> None:
    """Every file and folder under ``path`` readable and writable by its owner again (a case
    took them away), so that the folder can be removed."""
    for place in [path, *path.rglob("*")]:
        with contextlib.suppress(OSError):
            if not place.is_symlink():
                place.chmod(place.stat().st_mode | 0o700)


class Worker:
    """A process that reads runs for the classifier, one job at a time, within bounds.

    Args:
        user: the uid (and gid) it reads as; None: this process's.
        home: a folder it may write in, for its ``HOME``.
        warm_up: a good run and the dashboard's parameters for it, read before it drops to
            ``user``.
    """

    def __init__(
        self, user: int | None, home: Path, warm_up: tuple[Path, dict[str, str]] | None = None
    ) -> None:
        self.user = user
        self.home = home
        self.warm_up = warm_up
        self._process: subprocess.Popen[bytes] | None = None
        self._log = home / f"reader-{user}.log"

    def read(
        self, run: Path, params: dict[str, str], folder: Path, readers: Sequence[str]
    ) -> dict[str, Any] | str:
        """The readings of ``run``'s ``readers``, or why the process gave none."""
        token = uuid.uuid4().hex
        out = folder / f"readings-{token}.pickle"
        job = {
            "run": str(run),
            "params": dict(params),
            "folder": str(folder),
            "readers": list(readers),
            "out": str(out),
            "token": token,
        }
        try:
            process = self._started()
            assert process.stdin is not None
            process.stdin.write(json.dumps(job).encode() + b"\n")
            process.stdin.flush()
        except OSError as error:
            self.close()
            return f"the reading process could not be started or told: {error}"
        # Each reader has its bound in the process; this one is for the process itself, and
        # its warming up.
        if not self._answered(process, token, READER_SECONDS * (2 * len(readers) + 3) + 60):
            why = self._why(process)
            self.close()
            return why
        readings: dict[str, Any] = pickle.loads(out.read_bytes())
        out.unlink()
        return readings

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        import layerscope  # the same layerscope as this process's (PYTHONPATH=OTHER/src)

        source = str(Path(layerscope.__file__).parent.parent)
        environment = {
            **os.environ,
            "HOME": str(self.home),
            "PYTHONPATH": os.pathsep.join(filter(None, (source, os.environ.get("PYTHONPATH")))),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        command = [sys.executable, str(_CHILD)]
        if self.user is not None:
            command += ["--user", str(self.user)]
            if self.warm_up is not None:
                run, params = self.warm_up
                command += ["--warm-up", str(run), "--params", json.dumps(params)]

        def bound() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))

        with self._log.open("a") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                bufsize=0,
                cwd=self.home,
                env=environment,
                preexec_fn=bound,  # no threads of this process run meanwhile
            )
        return self._process

    @staticmethod
    def _answered(process: subprocess.Popen[bytes], token: str, seconds: float) -> bool:
        """Whether ``process`` prints ``token`` within ``seconds`` (what else it prints aside)."""
        assert process.stdout is not None
        descriptor = process.stdout.fileno()
        deadline = time.monotonic() + seconds
        said = b""
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([descriptor], [], [], left)
            if not ready:
                return False
            chunk = os.read(descriptor, 65536)
            if not chunk:
                return False  # it ended
            said = (said + chunk)[-4096:]
            if token.encode() in said:
                return True
        return False

    def _why(self, process: subprocess.Popen[bytes]) -> str:
        status = process.poll()
        if status is None:
            return "hang: the reading process gave no answer in time"
        log = (
            self._log.read_text(errors="replace").strip().splitlines() if self._log.exists() else []
        )
        last = log[-1] if log else ""
        return f"the reading process ended with status {status}: {last}"

    def close(self) -> None:
        if self._process is None:
            return
        with contextlib.suppress(OSError):
            self._process.kill()
        self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._process = None
