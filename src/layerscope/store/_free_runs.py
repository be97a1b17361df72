"""The first free run path of a series: ``runs/x``, else ``runs/x-2``, ``runs/x-3``...

A notebook cell run twice, or a second ``fit()`` into the same log folder, gets a run of its
own, as Hugging Face's and W&B's runs do, and never writes into an existing one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from layerscope.store._listing import holds_run
from layerscope.store.locations import location_filesystem

#: How many numbered paths are tried before giving up: a folder of that many runs of one name
#: is a script in a loop, not a person re-running a cell.
MAX_NUMBER = 10_000


def first_free_run(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> str:
    """``path`` if it holds no run (nor what is left of one), else the first free ``path-N``.

    ``storage_options``: those of ``path``'s filesystem, where it is a URL.

    Raises:
        FileExistsError: ``path`` and its ``MAX_NUMBER`` numbered paths all hold runs.
    """
    base = os.fspath(path).rstrip("/") or os.fspath(path)
    candidate = base
    for number in range(2, MAX_NUMBER + 2):
        fs, root = location_filesystem(candidate, storage_options=storage_options)
        if not holds_run(fs, root.rstrip("/") or root):
            return candidate
        candidate = f"{base}-{number}"
    raise FileExistsError(f"run: {base} and {base}-2 to {base}-{MAX_NUMBER + 1} all hold runs")
