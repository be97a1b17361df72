"""Readings of a run whose folder is not named ``run`` (``exp[1]``, ``a?``, ``a::b``), made
comparable with those of its reference, which is: the folder's name reads as ``run`` wherever a
reader shows it, and the dashboard's list of runs is taken in the order of their ids.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import corpus


def alike(readings: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """Each reading with the folder ``folder`` named ``run`` (see the module's docstring)."""
    return {reader: _renamed(reading, folder) for reader, reading in readings.items()}


def _renamed(value: Any, folder: str) -> Any:
    if isinstance(value, str):
        # The name where it stands alone, never inside another (``a1`` beside ``a?``).
        alone = rf"(?<![\w\[\]?*:.-]){re.escape(folder)}(?![\w\[\]?*:.-])"
        return re.sub(alone, corpus.RUN_FOLDER, value)
    if isinstance(value, Counter):
        return Counter({_renamed(key, folder): count for key, count in value.items()})
    if isinstance(value, dict):
        return {key: _renamed(item, folder) for key, item in value.items()}
    if isinstance(value, list):
        items = [_renamed(item, folder) for item in value]
        if items and all(isinstance(item, dict) and "id" in item for item in items):
            items.sort(key=lambda item: str(item["id"]))  # runs listed by folder name
        return items
    if isinstance(value, tuple):
        return tuple(_renamed(item, folder) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _renamed(getattr(value, f.name), folder) for f in dataclasses.fields(value)
        }
        return dataclasses.replace(value, **changes)
    return value
