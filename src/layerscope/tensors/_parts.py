"""Whole tensors of a run on disk: one safetensors file per batch, its records in the header.

A run writes a batch of records at the end of each step that kept some, as
``tensors/part-000001.safetensors``; each file says in its own metadata which record each
tensor is, so files are written once and never rewritten, and a run that stopped half-way
leaves every part it finished readable. Nothing is pickled.

Parts are read as input from anywhere: one that is damaged (truncated, garbage, records its
header does not describe, not a regular file) is left out with a warning naming it and why,
as a run's damaged segments are, and the other parts are read. On an object store, where every
question is a request, the one listing says what each entry is and a part is one GET (see
``store._objects``); a prefix with nothing under it holds no parts.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from layerscope._errors import LayerscopeWarning
from layerscope._imports import require
from layerscope.tensors._records import METADATA, Record, is_compact

DIRECTORY = "tensors"
_PART = re.compile(r"^part-(\d{6,})\.safetensors$")
# The type of each field a part's record gives (bool is no int here).
_FIELD_TYPES = {name: int if name in ("step", "call", "count") else str for name in METADATA}


class _PartError(ValueError):
    """A part that cannot be read: why."""


def part_name(number: int) -> str:
    """The file name of part ``number``.

    Examples:
        >>> part_name(12)
        'part-000012.safetensors'
    """
    return f"part-{number:06d}.safetensors"


def part_number(name: str) -> int | None:
    """The number of the part named ``name``, or None for a name that is not a part's.

    Examples:
        >>> part_number("part-000012.safetensors"), part_number("index.json")
        (12, None)
    """
    match = _PART.match(name)
    return None if match is None else int(match.group(1))


def part_bytes(records: Sequence[Record]) -> bytes:
    """One part's file: the records' values (CPU, compact), their metadata in the header."""
    safetensors_torch = require("safetensors.torch", "capture")
    values: dict[str, Tensor] = {}
    entries = []
    for number, record in enumerate(records):
        value = record.value
        if not is_compact(value):  # safetensors writes whole, unshared storages
            value = value.contiguous().clone()
        key = f"{number:06d}"
        values[key] = value
        entries.append({**record.metadata(), "key": key})
    payload: bytes = safetensors_torch.save(values, metadata={"records": json.dumps(entries)})
    return payload


def read_parts(
    fs: Any, directory: str, device: str = "cpu", skipped: dict[str, str] | None = None
) -> list[Record]:
    """Every record in the parts under ``directory`` (an fsspec path), in the order written.

    A part that cannot be read is left out with a ``LayerscopeWarning`` naming it and why;
    the other parts' records are read.

    Args:
        fs: the fsspec filesystem.
        directory: the parts' folder.
        device: where the values go.
        skipped: if given, gets the path of each part left out, and why.
    """
    safetensors_torch = require("safetensors.torch", "capture")
    try:
        kinds = _entry_kinds(fs, directory)
    except FileNotFoundError:
        return []
    except OSError as error:  # a folder this user may not read, say
        _skip(directory, f"{type(error).__name__}: {error.strerror or error}", skipped)
        return []
    numbered = [(number, name) for name in kinds if (number := part_number(name)) is not None]
    records = []
    for _, name in sorted(numbered):
        path = f"{directory}/{name}"
        try:
            records.extend(_part_records(fs, path, kinds[name], safetensors_torch, device))
        except _PartError as error:
            _skip(path, str(error), skipped)
    return records


def is_parts_directory(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds parts written by a run."""
    try:
        names = fs.ls(directory, detail=False)
    except FileNotFoundError:
        return False
    return any(part_number(_name(str(path))) is not None for path in names)


def _entry_kinds(fs: Any, directory: str) -> dict[str, str | None]:
    """Each name in ``directory``, and what it is where the listing says so at no cost.

    On a disk the kind is asked of each part as it is read (None here); on an object store
    the listing's detail gives it, so that nothing else is asked of the store.
    """
    from layerscope.store.file_access import is_object_store

    if not is_object_store(fs):
        return dict.fromkeys(_name(path) for path in fs.ls(directory, detail=False))
    return {_name(entry["name"]): entry.get("type") for entry in fs.ls(directory, detail=True)}


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _skip(path: str, reason: str, skipped: dict[str, str] | None) -> None:
    warnings.warn(
        f"layerscope: skipped {path}, which cannot be read ({reason})",
        LayerscopeWarning,
        stacklevel=3,
    )
    if skipped is not None:
        skipped[path] = reason


def _part_records(
    fs: Any, path: str, kind: str | None, safetensors_torch: Any, device: str
) -> list[Record]:
    """The records of the part at ``path``; ``kind`` is what the listing said it is, or None.

    Raises:
        _PartError: it cannot be read, or is not a part as ``part_bytes`` writes one.
    """
    safetensors = require("safetensors", "capture")
    try:
        if kind is None:
            kind = fs.info(path).get("type")
        if kind != "file":  # a FIFO would block the reader, a device never end
            raise _PartError(
                "a folder, not a file" if kind == "directory" else "not a regular file"
            )
        payload = _payload(fs, path)
    except OSError as error:  # vanished, or this user may not read it
        raise _PartError(f"{type(error).__name__}: {error.strerror or error}") from None
    try:
        values = safetensors_torch.load(payload)
    except safetensors.SafetensorError as error:
        raise _PartError(f"not a safetensors file: {error}") from None
    # A header safetensors read: 8 bytes of its length, then JSON.
    header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])
    try:
        entries = json.loads((header.get("__metadata__") or {}).get("records", "[]"))
    except ValueError:
        raise _PartError("its records' description is not JSON") from None
    if not isinstance(entries, list):
        raise _PartError("its records' description is not a list")
    return [_record(entry, number, values, device) for number, entry in enumerate(entries)]


def _payload(fs: Any, path: str) -> bytes:
    """The bytes of the file at ``path``: on an object store one GET, with no HEAD first."""
    from layerscope.store.file_access import is_object_store

    if is_object_store(fs):
        payload: bytes = fs.cat_file(path)
        return payload
    with fs.open(path, "rb") as file:
        payload = file.read()
    return payload


def _record(entry: Any, number: int, values: dict[str, Tensor], device: str) -> Record:
    """Record ``number`` of a part, as its description ``entry`` says, its value from ``values``."""
    if not isinstance(entry, dict):
        raise _PartError(f"record {number}: expected an object, got {type(entry).__name__}")
    for name, kind in _FIELD_TYPES.items():
        value = entry.get(name)
        if type(value) is not kind:
            expected = "an integer" if kind is int else "a string"
            raise _PartError(f"record {number}: {name}: expected {expected}, got {value!r:.40}")
    key = entry.get("key")
    if not isinstance(key, str) or key not in values:
        raise _PartError(f"record {number}: key: no tensor {key!r:.40} in the file")
    return Record(**{name: entry[name] for name in METADATA}, value=values[key].to(device))
