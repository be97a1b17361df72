"""Where a run or folder given as a string is: a local path, or an fsspec URL.

A path is a name, never a pattern: a run folder named ``exp[1]`` or ``a?`` is that folder,
and one named ``a::b`` is not an fsspec chain of ``a`` and ``b``. Only a string that holds
``://`` and is no local path that exists is a URL, and fsspec reads it as such.

Options for the filesystem of a URL (``storage_options``: credentials, an endpoint) are passed
as they are to fsspec, which also adds those of its configuration (``FSSPEC_S3='{...}'`` in
the environment, or ``~/.config/fsspec/``). An object store's listings are read anew each
time: a run being written gains files that a cached listing would hide.

This one function decides it for every stage that opens a run or a folder of runs (the
reader, the listing, the writer, whole tensors, the trainer callbacks); it is a module of
its own, not a name of ``layerscope.store``'s face, so that ``layerscope.tensors``, which
that face uses, can take it without a loop.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from layerscope._imports import require
from layerscope.store._objects import OBJECT_PROTOCOLS

#: What makes a string a URL rather than a local path (unless a local path of that name exists).
URL_MARK = "://"


class ListedFolder(str):
    """A folder a listing found, as its URL, that opens as the folder it was found at.

    The URL alone may read as another place (``memory://runs/a::b`` as an fsspec chain), so
    ``location_filesystem`` takes the filesystem and path that the listing found instead.
    """

    fs: Any
    path: str

    def __new__(cls, url: str, fs: Any, path: str) -> ListedFolder:
        """The folder at ``path`` of ``fs``, shown as ``url``."""
        folder = super().__new__(cls, url)
        folder.fs, folder.path = fs, path
        return folder


def check_storage_options(options: object) -> dict[str, Any]:
    """``options`` as a dict of keyword arguments for a filesystem, or a ``TypeError``.

    Examples:
        >>> check_storage_options({"anon": True}), check_storage_options(None)
        ({'anon': True}, {})
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        raise TypeError(
            f"storage_options: expected a dict of the filesystem's options by name, got "
            f"{type(options).__name__}"
        )
    return dict(options)


def location_filesystem(
    location: str | os.PathLike[str],
    *,
    fresh: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[Any, str]:
    """The fsspec filesystem ``location`` is on, and its path there.

    Args:
        location: a local path (relative, absolute or ``~``), or a URL such as
            ``s3://bucket/runs/exp1`` (fsspec chains like ``simplecache::s3://...`` too).
        fresh: a filesystem object of its own rather than fsspec's shared one, so that a
            transaction someone opens on the shared one holds nothing of ours back.
        storage_options: options of a URL's filesystem (s3fs's ``key``, ``secret``,
            ``client_kwargs={"endpoint_url": ...}``...); a local path takes none.

    Returns:
        ``(fs, path)``: for a local path, the absolute path with ``/`` separators, as
        fsspec's local filesystem names it; no trailing ``/`` but for the root.

    Examples:
        >>> fs, path = location_filesystem("/runs/exp[1]")
        >>> fs.protocol[0], path
        ('file', '/runs/exp[1]')
        >>> location_filesystem("/runs/a::b")[1]
        '/runs/a::b'
        >>> location_filesystem("memory://runs/exp1")[0].protocol
        'memory'
    """
    fsspec = require("fsspec", "dataframe")
    given = check_storage_options(storage_options)
    if isinstance(location, ListedFolder):  # where a listing found it, whatever its URL says
        fs = location.fs
        if fresh:
            fs = type(fs)(**{**fs.storage_options, "skip_instance_cache": True})
        return fs, location.path
    text = os.fspath(location)
    options = {"skip_instance_cache": True} if fresh else {}
    if URL_MARK in text and not os.path.lexists(text):
        # A chain (``simplecache::s3://``) is named by its first protocol: it keeps its own.
        if text.partition(URL_MARK)[0] in OBJECT_PROTOCOLS:
            given = {"use_listings_cache": False, **given}
        fs, path = fsspec.core.url_to_fs(text, **{**given, **options})
        return fs, path
    local = require("fsspec.implementations.local", "dataframe")
    return fsspec.filesystem("file", **options), local.make_path_posix(text).rstrip("/") or "/"


def run_path(path: object) -> str:
    """``path``, a run's path or URL as given, as a string.

    Raises:
        TypeError: it is not a path or a string.
        ValueError: it is empty.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"path: expected the path or URL of a run directory, got {type(path).__name__}"
        )
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ValueError(f"path: expected the path or URL of a run directory, got {text!r}")
    return text
