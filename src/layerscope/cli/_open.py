"""Opening runs for a command: what cannot be opened becomes one line for the user, no trace."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from layerscope.store import Run

# What the reader raises for a path that holds no readable run (a missing folder, a file, a
# run of a newer layerscope, a run.json that is not JSON); other errors are bugs and keep
# their traceback.
_NOT_A_RUN = (OSError, ValueError, TypeError)
# The libraries behind an object store's filesystem: their errors (no credentials, a denied
# request) say why a run there cannot be read, and are no bug of layerscope's.
_STORAGE_LIBRARIES = ("botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "azure", "google")
# The reader's messages start with the argument they blame ("path: no run at ..."); on the
# command line the path is the argument, so the prefix says nothing.
_ARGUMENT_PREFIX = re.compile(r"^(path|root): ")


class CommandError(Exception):
    """A failure the command reports in one line on stderr, exiting with status 2."""


def open_run(path: str, storage_options: Mapping[str, Any] | None = None) -> Run:
    """``layerscope.load(path, storage_options=...)``, or a CommandError saying why no run."""
    from layerscope.store import load

    try:
        return load(path, storage_options=storage_options)
    except Exception as error:
        if not isinstance(error, _NOT_A_RUN):
            raise _storage_error(error, path) from None
        missing = isinstance(error, FileNotFoundError)
        held = _runs_inside(path, storage_options) if missing else ""
        if held:
            raise CommandError(
                f"{path} is a folder of runs ({held}), not a run: `layerscope runs {path}` "
                "lists them; give one of them"
            ) from None
        raise CommandError(_one_line(error, path)) from None


def _runs_inside(path: str, storage_options: Mapping[str, Any] | None) -> str:
    """``"2 runs: a, b"`` where ``path`` is a folder of runs, else ``""``.

    The runs are those ``layerscope runs`` lists; a run's ranks' folders are not runs.
    """
    from layerscope.store import directory_rank, run_folders

    try:
        folders = run_folders(path, storage_options)
        names = sorted(name for name, _ in folders if directory_rank(name) is None)
    except _NOT_A_RUN:
        return ""
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} run{'s' if len(names) > 1 else ''}: {shown}"


def list_run_rows(
    root: str, storage_options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The rows of ``layerscope.runs(root, ...)`` as dicts (times in seconds), without pandas."""
    from layerscope.store import run_folders, run_row

    try:
        folders = run_folders(root, storage_options)
    except _NOT_A_RUN as error:
        raise CommandError(_one_line(error, root)) from None
    except Exception as error:
        raise _storage_error(error, root) from None
    return [row for name, location in folders if (row := run_row(location, name)) is not None]


def _one_line(error: BaseException, path: str) -> str:
    """The first line of ``error``'s message, saying which path it is about."""
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        return f"{error.strerror}: {error.filename}"  # "Permission denied: runs/a/run.json"
    lines = _ARGUMENT_PREFIX.sub("", str(error)).splitlines()
    line = lines[0] if lines and lines[0] else type(error).__name__
    return line if path in line else f"{path}: {line}"  # a run.json that is not JSON, say


def _storage_error(error: Exception, path: str) -> Exception:
    """A CommandError of an object store's library's ``error``; any other error as it is."""
    if type(error).__module__.split(".")[0] not in _STORAGE_LIBRARIES:
        return error
    lines = str(error).splitlines()
    why = f": {lines[0]}" if lines and lines[0] else ""
    return CommandError(f"{path}: {type(error).__name__}{why}")
