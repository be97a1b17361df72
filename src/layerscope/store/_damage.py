"""What a reader says of a run's damaged files: an error naming the file, or a warning.

Runs travel between people and machines, so their files are input like any other: a reader
never trusts them. A file the run cannot be read without (the root's ``run.json``, the
``modules.json`` asked for) that is damaged raises ``RunFileError``, naming the file and, where
one is to blame, the field. A file the run can be read without (a segment, a rank's
``run.json``) is left out with a ``LayerscopeWarning`` that names it and says why; the ``Run``
keeps the list in ``Run.skipped`` so that a dashboard can show it beside what it read.
"""

from __future__ import annotations

import warnings

from layerscope._errors import LayerscopeWarning


class RunFileError(ValueError):
    """A file of a run cannot be read, or holds a field of the wrong type.

    Attributes:
        path: the file.
        field: the field to blame (``config.stats``, ``[3].type``), or None for the whole file.
    """

    def __init__(self, path: str, reason: str, field: str | None = None) -> None:
        where = f"{path}: {field}" if field else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.field = field
        self.reason = reason


def warn_damaged(path: str, error: BaseException | str) -> str:
    """Warn that ``path`` was skipped, for ``error``, and go on reading the rest.

    Returns:
        The reason, as the warning gives it.
    """
    reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    warnings.warn(
        f"layerscope: skipped {path}, which cannot be read ({reason})",
        LayerscopeWarning,
        stacklevel=4,
    )
    return reason
