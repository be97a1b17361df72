"""Whole tensors of a run on disk: one safetensors file per batch, its records in the header.

A run writes a batch of records at the end of each step that kept some, as
``tensors/part-000001.safetensors``; each file says in its own metadata which record each
tensor is, so files are written once and never rewritten, and a run that stopped half-way
leaves every part it finished readable. Nothing is pickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from layerscope._imports import require
from layerscope.tensors._records import METADATA, Record, is_compact

DIRECTORY = "tensors"
_PART = re.compile(r"^part-(\d{6,})\.safetensors$")


def part_name(number: int) -> str:
    """The file name of part ``number``.

    Examples:
        >>> part_name(12)
        'part-000012.safetensors'
    """
    return f"part-{number:06d}.safetensors"


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


def read_parts(fs: Any, directory: str, device: str = "cpu") -> list[Record]:
    """Every record in the parts under ``directory`` (an fsspec path), in the order written."""
    safetensors_torch = require("safetensors.torch", "capture")
    try:
        names = [path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(directory, detail=False)]
    except FileNotFoundError:
        return []
    numbered = [(int(match.group(1)), name) for name in names if (match := _PART.match(name))]
    parts = [name for _, name in sorted(numbered)]
    records = []
    for name in parts:
        with fs.open(f"{directory}/{name}", "rb") as file:
            payload = file.read()
        records.extend(_records(payload, safetensors_torch, device))
    return records


def is_parts_directory(fs: Any, directory: str) -> bool:
    """Whether ``directory`` holds parts written by a run."""
    try:
        names = fs.ls(directory, detail=False)
    except FileNotFoundError:
        return False
    return any(_PART.match(str(name).rstrip("/").rsplit("/", 1)[-1]) for name in names)


def _records(payload: bytes, safetensors_torch: Any, device: str) -> list[Record]:
    values = safetensors_torch.load(payload)
    header_length = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + header_length])
    entries = json.loads(header.get("__metadata__", {}).get("records", "[]"))
    return [
        Record(
            **{name: entry[name] for name in METADATA},
            value=values[entry["key"]].to(device),
        )
        for entry in entries
    ]
