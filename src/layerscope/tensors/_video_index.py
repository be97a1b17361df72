"""Which video file holds which tensor: ``videos/.<what>.json`` for the folder ``videos/<what>``.

A worker started again after a failure reads it to go on with each tensor's video instead of
beginning another file. Written whole and renamed into place each time a video begins (a few
times a run); read as untrusted data: an entry that is not a plain video file name with four
strings is left out, and a file that cannot be read is as none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

MAX_BYTES = 16 << 20  # far beyond any run's videos: a larger file is not ours


def files(folder: Path, suffix: str) -> dict[tuple[str, str, str, str], str]:
    """The file name of each (module, kind, tensor, phase) video ending in ``suffix``."""
    found: dict[tuple[str, str, str, str], str] = {}
    for name, key in _entries(folder).items():
        if name.endswith(suffix) and (folder / name).is_file():
            found[key] = name
    return found


def add(folder: Path, name: str, key: Sequence[str]) -> None:
    """Say that the video ``name`` in ``folder`` holds ``key``'s frames."""
    entries = {file: list(owner) for file, owner in _entries(folder).items()}
    entries[name] = list(key)
    folder.mkdir(parents=True, exist_ok=True)
    index = _index(folder)
    temporary = index.with_name(f"{index.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(entries), encoding="utf-8")
    os.replace(temporary, index)


def _index(folder: Path) -> Path:
    """Beside the folder, not in it: the folder holds videos only."""
    return folder.parent / f".{folder.name}.json"


def _entries(folder: Path) -> dict[str, tuple[str, str, str, str]]:
    path = _index(folder)
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return {}
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {
        name: (owner[0], owner[1], owner[2], owner[3])
        for name, owner in loaded.items()
        if _plain_video_name(name)
        and isinstance(owner, list)
        and len(owner) == 4
        and all(isinstance(part, str) for part in owner)
    }


def _plain_video_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and Path(name).name == name
        and not name.startswith(".")
        and name.endswith((".gif", ".mp4"))
    )
