"""A capture on disk: values in safetensors files, everything else in ``capture.json``.

``capture.json`` lists the records in order with their metadata, the file that holds each
value and its key there; values go into files of at most ``SHARD_BYTES`` each. A value that is
not a tensor (what ``stash`` or ``stash_value`` returned) is written into the index as tagged
JSON (``_values.encode``), the tensors inside it into the files; such a capture is version 2,
or 3 where a value holds a namedtuple, a dataclass or a mapping (which readers of version 2
would take for a tensor), one of tensors only version 1, as before. A module's output kept
whole says so (``"whole": true``). Nothing is pickled: loading a capture runs no code
from the files. The index is written last, by an atomic rename, so a directory always holds a
complete capture or none.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from layerscope._imports import require
from layerscope.tensors._records import METADATA, Record, is_compact
from layerscope.tensors._values import decode, encode, uses_objects

INDEX = "capture.json"
FORMAT = "layerscope.capture"
VERSION = 1  # of a capture whose values are all tensors
VALUES_VERSION = 2  # of one with other values too
OBJECTS_VERSION = 3  # of one whose values hold namedtuples, dataclasses or mappings
SHARD_BYTES = 1 << 30


def write_records(
    records: Sequence[Record],
    directory: str | os.PathLike[str],
    info: dict[str, Any],
    overwrite: bool = False,
) -> Path:
    """Write ``records`` under ``directory``; see ``Capture.save``."""
    safetensors_torch = require("safetensors.torch", "capture")
    path = Path(directory)
    index_path = path / INDEX
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"dir: {str(path)!r} is a file, not a directory")
    old_files: list[str] = []
    if index_path.exists():
        if not overwrite:
            raise FileExistsError(
                f"dir: {str(path)!r} already holds a capture; pass overwrite=True to replace it"
            )
        old_files = list(_read_index(path).get("files", []))
    path.mkdir(parents=True, exist_ok=True)

    token = uuid.uuid4().hex[:8]  # new names: the old capture stays whole until the index moves
    files: list[str] = []
    entries: list[dict[str, Any]] = []
    shard: dict[str, Tensor] = {}
    shard_bytes = 0

    def flush() -> None:
        nonlocal shard, shard_bytes
        if not shard:
            return
        name = f"values-{token}-{len(files):05d}.safetensors"
        safetensors_torch.save_file(shard, str(path / name))
        files.append(name)
        shard, shard_bytes = {}, 0

    def add(tensor: Tensor, key: str) -> dict[str, Any]:
        nonlocal shard_bytes
        value = tensor.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        if not is_compact(value):  # safetensors writes whole, unshared storages
            value = value.clone(memory_format=torch.contiguous_format)
        size = value.numel() * value.element_size()
        if shard and shard_bytes + size > SHARD_BYTES:
            flush()
        shard[key] = value
        shard_bytes += size
        return {"file": len(files), "key": key}

    version = VERSION
    for number, record in enumerate(records):
        key = f"{number:08d}"
        if isinstance(record.value, Tensor):
            entries.append({**record.metadata(), **add(record.value, key)})
            continue
        try:
            encoded = encode(record.value, partial(_add_numbered, add, key, count()))
        except TypeError as error:
            raise TypeError(f"save: record {number} ({record!r}): {error}") from None
        version = max(version, OBJECTS_VERSION if uses_objects(encoded) else VALUES_VERSION)
        entry = {**record.metadata(), "value": encoded}
        entries.append({**entry, "whole": True} if record.whole else entry)
    flush()

    index = {"format": FORMAT, "version": version, "files": files, "info": info}
    index["records"] = entries
    temporary = path / f".{INDEX}.{token}.tmp"
    temporary.write_text(json.dumps(index, indent=1), encoding="utf-8")
    os.replace(temporary, index_path)
    for name in old_files:
        if name not in files and _is_value_file(name):
            (path / name).unlink(missing_ok=True)
    return path


def _add_numbered(
    add: Callable[[Tensor, str], dict[str, Any]], key: str, numbers: Iterator[int], tensor: Tensor
) -> dict[str, Any]:
    """``add`` the record's next tensor under ``<key>.<n>``."""
    return add(tensor, f"{key}.{next(numbers)}")


def read_records(
    directory: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[list[Record], dict[str, Any]]:
    """The records and the info saved under ``directory`` by ``write_records``."""
    safetensors_torch = require("safetensors.torch", "capture")
    path = Path(directory)
    index = _read_index(path)
    files = index["files"]
    for name in files:
        if not _is_value_file(name):
            raise ValueError(f"dir: {str(path / INDEX)!r} names a file that is not a value file")
    values = [safetensors_torch.load_file(str(path / name), device=str(device)) for name in files]
    records = []
    for number, entry in enumerate(index["records"]):
        try:
            records.append(_record(entry, values))
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(
                f"dir: record {number} of {str(path / INDEX)!r} is damaged "
                f"({type(error).__name__}: {error})"
            ) from None
    return records, dict(index.get("info", {}))


def _record(entry: dict[str, Any], values: list[dict[str, Tensor]]) -> Record:
    """One record of the index, its tensors read from the loaded value files."""
    metadata = {name: entry[name] for name in METADATA}
    if "value" in entry:
        value = decode(entry["value"], lambda where: values[where["file"]][where["key"]])
    else:
        value = values[entry["file"]][entry["key"]]
    return Record(**metadata, value=value, whole=entry.get("whole") is True)


def _read_index(path: Path) -> dict[str, Any]:
    index_path = path / INDEX
    if not index_path.is_file():
        raise FileNotFoundError(f"dir: no capture in {str(path)!r} (no {INDEX})")
    index: dict[str, Any] = json.loads(index_path.read_text(encoding="utf-8"))
    versions = (VERSION, VALUES_VERSION, OBJECTS_VERSION)
    if index.get("format") != FORMAT or index.get("version") not in versions:
        raise ValueError(
            f"dir: {str(index_path)!r} is not a layerscope capture of version "
            f"{', '.join(map(str, versions))}"
        )
    return index


def _is_value_file(name: object) -> bool:
    """A plain file name of ours: an index cannot point outside its directory."""
    return (
        isinstance(name, str)
        and name.startswith("values-")
        and name.endswith(".safetensors")
        and Path(name).name == name
    )
