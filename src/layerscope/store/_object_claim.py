"""Claiming a rank's place on an object store: a claim object that only one writer can create.

An object store has no locks, but S3 has conditional writes: a PUT with ``If-None-Match: *``
(what s3fs sends for a file opened ``"xb"``) creates the object only if no object has that
key, and fails otherwise, atomically. So of two writers starting a run in the same place at
once, exactly one creates the claim, ``.run.lock`` holding its pid and host, and the other is
refused, as ``flock`` decides it on a disk. The writer removes the claim at close; its
``run.json``, written just after the claim, keeps the place taken from then on.

Unlike a lock, the claim outlives a writer that is killed: one killed between its claim and
its ``run.json`` (milliseconds, at ``watch()``) leaves a claim and no run, and the place is
refused until someone removes ``.run.lock``; the message says so. A store whose conditional
write is missing (an older S3-compatible server ignores the header) takes the claim from
each writer: there, as where files cannot be locked, a second writer is refused once the
first one's ``run.json`` is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

from layerscope.store._files import remove_file
from layerscope.store._objects import abandon

#: What is read of another writer's claim: its note is small, and not ours.
NOTE_BYTES = 4096


class ObjectClaim:
    """A claim object this process created; ``release`` removes it (safe to call twice).

    Args:
        fs: the object store's filesystem.
        path: the claim's key.
    """

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.lock_path: str | None = path

    def release(self) -> None:
        path, self.lock_path = self.lock_path, None
        if path is not None:
            with contextlib.suppress(OSError):  # left behind, it only costs a later writer
                remove_file(self.fs, path)


def create_claim(fs: Any, path: str) -> ObjectClaim | None:
    """Create the claim object at ``path`` if no object is there.

    Returns:
        The claim; None where the filesystem cannot create a file only if it is absent.

    Raises:
        FileExistsError: the claim is there: another writer holds the place, or held it.
        OSError: the object cannot be written (no bucket, no permission).
    """
    note = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
    try:
        file = fs.open(path, "xb")
    except (ValueError, NotImplementedError):  # no exclusive create: run.json keeps the place
        return None
    try:
        file.write(note)
    except BaseException:
        abandon(file)
        raise
    file.close()  # the conditional PUT: FileExistsError if the claim is there
    return ObjectClaim(fs, path)


def claim_note(fs: Any, path: str) -> bytes:
    """The first bytes of the claim at ``path``, or none if it cannot be read."""
    try:
        note: bytes = fs.cat_file(path, start=0, end=NOTE_BYTES)
    except OSError:
        return b""
    return note
