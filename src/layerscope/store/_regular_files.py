"""Opening a run's files for reading: regular files only, and JSON of a bounded size.

A run folder may come from anyone, so what stands where a file should be is not trusted: a
FIFO blocks whoever opens it until someone writes to it (forever, for a reader), and a link
to ``/dev/zero`` never ends. So a reader looks before it opens (``stat`` opens nothing, and
opening some devices does something), opens without blocking, and checks again what it
opened, in case it was swapped meanwhile. A JSON file is read up to a bound. An object store
holds objects only: what was opened there is asked what it is, with no request of its own.
"""

from __future__ import annotations

import os
import stat
from typing import Any, BinaryIO

from layerscope.store._damage import RunFileError
from layerscope.store._objects import is_object_store

#: The most bytes of ``run.json`` or ``modules.json`` read. A ``run.json`` is a few KiB
#: (its configuration and argv), a ``modules.json`` about 250 bytes a module: 64 MiB holds
#: the tree of a model of 250,000 modules, and parsing it costs a reader a few hundred MiB,
#: not what a file without end would.
JSON_LIMIT = 64 * 2**20

# Opened without waiting for a writer (a FIFO), as binary where that is a flag (Windows).
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(fs: Any, path: str) -> BinaryIO:
    """``path`` of ``fs`` opened for reading in binary, if it is a regular file (links followed).

    Raises:
        RunFileError: ``path`` is something else (a FIFO, a device, a folder), named.
        FileNotFoundError: there is nothing at ``path``.
        OSError: it cannot be opened (permissions).
    """
    if is_object_store(fs):
        file: BinaryIO = fs.open(path, "rb")
        # What opening it asked of the store: a prefix of objects opens as a folder.
        _check_kind(path, getattr(file, "details", {}).get("type", "file"), file)
        return file
    if not is_local(fs):
        _check_kind(path, fs.info(path).get("type"))
        opened: BinaryIO = fs.open(path, "rb")
        return opened
    _check_mode(path, os.stat(path).st_mode)
    descriptor = os.open(path, _FLAGS)
    try:
        _check_mode(path, os.fstat(descriptor).st_mode)  # what was opened, if it changed since
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_bounded(fs: Any, path: str, limit: int = JSON_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, if it holds at most ``limit`` of them.

    Raises:
        RunFileError: ``path`` is not a regular file, or holds more than ``limit`` bytes.
        FileNotFoundError: there is nothing at ``path``.
        OSError: it cannot be read.
    """
    with open_regular(fs, path) as file:
        payload = file.read(limit + 1)
    if len(payload) > limit:
        raise RunFileError(path, f"larger than {limit // 2**20} MiB: not read")
    return payload


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local disk (where FIFOs and devices are)."""
    return fs.protocol in ("file", ("file", "local"))


def _check_kind(path: str, kind: object, opened: BinaryIO | None = None) -> None:
    """Raise ``RunFileError`` unless fsspec's ``kind`` of ``path`` is a file (closing it)."""
    if kind == "file":
        return
    if opened is not None:
        opened.close()
    raise RunFileError(path, f"{_article(kind)}, not a regular file")


def _check_mode(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")
    raise RunFileError(path, f"{kind}, not a regular file")


def _article(kind: object) -> str:
    """An fsspec ``info`` type in words: ``directory`` -> ``a folder``."""
    return {"directory": "a folder"}.get(str(kind), f"a {kind}")
