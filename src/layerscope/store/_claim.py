"""Claiming a directory for a run: no run there already, and no files that are not a run's.

A writer holds its rank's place for as long as it lives: ``claim_place`` takes an exclusive
``flock`` on a hidden file there, so that of two processes starting a run in the same place
at once exactly one gets it, and the other is refused at ``watch()``. The kernel lets the lock
go when its process ends, however it ends, so a killed writer never holds a place for good;
the run it left (its ``run.json``) is what keeps the place taken. On an object store the
claim is an object only one writer can create (see ``_object_claim``). Where files can be
neither locked nor created exclusively (a filesystem without locks), a second writer is
refused once the first one's ``run.json`` is there, which it writes as it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any, Protocol

from layerscope.store._files import file_names
from layerscope.store._layout import RUN_ENTRIES, RUN_FILE, directory_rank
from layerscope.store._object_claim import claim_note, create_claim
from layerscope.store._objects import is_object_store

try:
    import fcntl
except ImportError:  # Windows: no flock; a place is taken once its run.json is there
    fcntl = None  # type: ignore[assignment]  # checked before use

# Hidden: readers, the check for foreign files and the removal of temporaries pass it by.
CLAIM_FILE = ".run.lock"
_HOLDER_BYTES = 4096  # what is read of a holder's note: it is another process's file


class Claim(Protocol):
    """A writer's hold on its place: a lock on a disk, a claim object on an object store."""

    lock_path: str | None

    def release(self) -> None:
        """Let the place go; safe to call twice."""


class PlaceClaim:
    """This process's hold on a rank's place; ``release`` lets it go and removes its file.

    Args:
        lock_path: the claim file, or None where nothing was locked.
        descriptor: the open, locked claim file, or None.
    """

    def __init__(self, lock_path: str | None = None, descriptor: int | None = None) -> None:
        self.lock_path = lock_path
        self._descriptor = descriptor

    def release(self) -> None:
        """Remove the claim file, then unlock it; safe to call twice.

        A process that opened the file meanwhile sees it gone once it locks it, and opens the
        next one (see ``claim_place``).
        """
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is None:
            return
        try:
            if self.lock_path is not None:
                with contextlib.suppress(OSError):  # gone already: nothing to remove
                    os.unlink(self.lock_path)
        finally:
            os.close(descriptor)  # closing the last descriptor of the file unlocks it


def claim_place(fs: Any, place: str, path: str) -> Claim:
    """Hold ``place`` (a directory, made already where the filesystem has them), or refuse.

    Args:
        fs: the fsspec filesystem of the run.
        place: the rank's directory on ``fs``.
        path: the run's path as the user gave it, for messages.

    Raises:
        FileExistsError: a live process holds the place; on an object store, a run is there,
            or a claim a writer made and did not remove.
        OSError: the claim file cannot be made (a full disk, no permission, no bucket).
    """
    if is_object_store(fs):
        return _claim_object(fs, place, path)
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    if fcntl is None or "file" not in protocols:
        return PlaceClaim()
    lock_path = f"{place}/{CLAIM_FILE}"
    while True:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(_read_note(descriptor))
            os.close(descriptor)
            raise FileExistsError(_taken(path, holder)) from None
        except OSError:  # a filesystem without locks: its run.json keeps the place
            os.close(descriptor)
            return PlaceClaim()
        if _still_there(descriptor, lock_path):
            break
        os.close(descriptor)  # its holder removed it as we opened it: take the next one
    try:
        note = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, note, 0)
    except BaseException:
        PlaceClaim(lock_path, descriptor).release()
        raise
    return PlaceClaim(lock_path, descriptor)


def _claim_object(fs: Any, place: str, path: str) -> Claim:
    """Create the place's claim object, or refuse as ``claim_place`` says.

    A claim outlives a killed writer (see ``_object_claim``): the message says what to do.
    """
    lock_path = f"{place}/{CLAIM_FILE}"
    try:
        claim = create_claim(fs, lock_path)
    except FileExistsError:
        holder = _holder(claim_note(fs, lock_path))
        if fs.exists(f"{place}/{RUN_FILE}"):
            raise FileExistsError(
                f"run: {path} is being written by another process{holder}, or holds the run "
                f"of one that was killed; layerscope never overwrites a run. Pass a new "
                f"directory."
            ) from None
        raise FileExistsError(
            f"{_taken(path, holder)} A writer killed as it started leaves {CLAIM_FILE} there "
            f"and no {RUN_FILE}: remove it if no process writes this run."
        ) from None
    return PlaceClaim() if claim is None else claim


def _taken(path: str, holder: str) -> str:
    """Why a place another writer holds is refused."""
    return (
        f"run: {path} is being written by another process{holder}; pass a new "
        f"directory. (A rank of a distributed job whose process group starts after "
        f"watch() needs RANK and WORLD_SIZE in its environment, as torchrun sets them, "
        f"to write in a place of its own.)"
    )


def _read_note(descriptor: int) -> bytes:
    try:
        return os.pread(descriptor, _HOLDER_BYTES, 0)
    except OSError:
        return b""


def _still_there(descriptor: int, lock_path: str) -> bool:
    """Whether the locked file is still the one at ``lock_path``."""
    try:
        held, there = os.fstat(descriptor), os.stat(lock_path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _holder(raw: bytes) -> str:
    """`` (pid N on host H)`` from a holder's note, or nothing where it says nothing sound."""
    try:
        note = json.loads(raw)
        pid, host = note["pid"], note["host"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return ""
    if not isinstance(pid, int) or not isinstance(host, str) or len(host) > 255:
        return ""
    return f" (pid {pid} on host {host!r})"


def check_free(fs: Any, root: str, path: str, place: str) -> None:
    """Raise ``FileExistsError`` if ``place`` (relative to ``root``) holds a run.

    Args:
        fs: the fsspec filesystem.
        root: the run's directory on ``fs``.
        path: the run's path as the user gave it, for messages.
        place: a rank's directory relative to ``root`` ("" for the root).
    """
    where = f"{root}/{place}".rstrip("/")
    if fs.exists(f"{where}/{RUN_FILE}"):
        whose = f" (at {place})" if place else ""
        raise FileExistsError(
            f"run: {path} already holds a run{whose}; layerscope never overwrites "
            f"one. Pass a new directory."
        )


def check_own_directory(fs: Any, root: str, path: str) -> None:
    """Raise ``FileExistsError`` unless the root is new, empty, or only a run's files.

    A run gets a directory of its own: written among a user's files, its compaction and
    a later ``layerscope`` would share the folder with them. Other ranks' files, and what
    a killed writer of this run left, are a run's.
    """
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise FileExistsError(f"run: {path} is a file; pass a directory that is new or empty")
    foreign = sorted(
        name
        for name in file_names(fs, root)
        if name not in RUN_ENTRIES
        and directory_rank(name) is None
        and not name.startswith(".")  # reserve and temporaries of a killed writer
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise FileExistsError(
            f"run: {path} holds files that are not a run's ({shown}); pass a "
            f"directory that is new or empty"
        )
