"""Names for DuckDB of files whose paths it would take for patterns.

DuckDB's ``read_parquet`` expands ``*``, ``?`` and ``[...]`` in every path it is given, so
the segment ``runs/exp[1]/stats/seg-000001.parquet`` would read run ``exp1``'s. A file whose
path holds such a character is given to DuckDB under a plain name instead,
``layerscope-file://f000001.parquet``, through a filesystem registered with the database that
opens the file the name stands for. DuckDB reads those through Python, about twice as slowly
as it reads a local path, so paths without such characters are still given as they are.

On an object store every file is read through Python anyway, and DuckDB asks about each file
it binds many times over (glob, exists, size, modification time), each a request: every file
there is given under a plain name, and what is asked of a table file, which never changes once
it appears (``_layout``), is asked of the store once.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from fsspec import AbstractFileSystem  # type: ignore[import-untyped]  # no type hints

from layerscope.store._layout import segment_range
from layerscope.store._objects import is_object_store
from layerscope.store._regular_files import open_regular

PROTOCOL = "layerscope-file"
# What DuckDB could read as more than a name: its glob's characters, an escape, a URL inside,
# an fsspec chain (``memory://runs/a::b``, which fsspec's memory filesystem misreads).
_SPECIAL = ("*", "?", "[", "]", "{", "}", "\\", "://", "::")


def needs_alias(path: str, fs: Any = None) -> bool:
    """Whether DuckDB is to read ``path`` (of ``fs``, no protocol) under a plain name.

    Yes where it could read the path as a pattern, and for every file of an object store.

    Examples:
        >>> needs_alias("/runs/exp1/stats/seg-000001.parquet")
        False
        >>> needs_alias("/runs/exp[1]/stats/seg-000001.parquet"), needs_alias("/runs/a?/x")
        (True, True)
    """
    return any(mark in path for mark in _SPECIAL) or (fs is not None and is_object_store(fs))


class FileAliases(AbstractFileSystem):  # type: ignore[misc]  # a class of fsspec's: Any
    """A read-only filesystem of plain names, each standing for a file of another filesystem.

    Args:
        fs: the filesystem the files are on.
    """

    protocol = PROTOCOL
    cachable = False  # one per database: its names are that database's

    def __init__(self, fs: Any) -> None:
        super().__init__()
        self._fs = fs
        self._paths: dict[str, str] = {}  # name -> the file's path
        self._names: dict[str, str] = {}  # path -> name
        self._lock = threading.Lock()  # a run's queries may come from several threads
        self._stable: dict[tuple[str, str], Any] = {}  # (question, path) -> a table file's answer

    def url(self, path: str) -> str:
        """The URL DuckDB reads ``path`` by: the same one each time it is asked."""
        with self._lock:
            name = self._names.get(path)
            if name is None:
                name = f"f{len(self._names) + 1:06d}.parquet"
                self._names[path] = name
                self._paths[name] = path
        return f"{PROTOCOL}://{name}"

    def path_of(self, url: str) -> str:
        """The path the name in ``url`` stands for.

        Raises:
            FileNotFoundError: no file has that name.
        """
        name = self._strip_protocol(url)
        if name not in self._paths:
            raise FileNotFoundError(url)
        return self._paths[name]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        found = dict(self._ask("info", self.path_of(path)))
        found["name"] = self._strip_protocol(path)
        return found

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        found = self.info(path)  # a name is a file: it lists as itself
        return [found] if detail else [found["name"]]

    def glob(self, path: str, **kwargs: Any) -> list[str]:
        # A name is never a pattern: it is the file, or nothing.
        name = self._strip_protocol(path)
        return [name] if name in self._paths else []

    def modified(self, path: str) -> datetime.datetime:
        try:
            return self._ask("modified", self.path_of(path))  # type: ignore[no-any-return]
        except NotImplementedError:  # a filesystem that keeps no times: files never change
            return datetime.datetime.fromtimestamp(0, datetime.timezone.utc)

    def _ask(self, question: str, path: str) -> Any:
        """``self._fs.<question>(path)``; once only for a table file, which never changes."""
        if segment_range(path.rsplit("/", 1)[-1]) is None:  # calls.parquet is written anew
            return getattr(self._fs, question)(path)
        key = (question, path)
        if key not in self._stable:
            self._stable[key] = getattr(self._fs, question)(path)
        return self._stable[key]

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError(f"{path}: read only")
        return open_regular(self._fs, self.path_of(path))
