"""What a capture's records offer, open, closed or loaded: a frame, a save, a clear."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from layerscope._imports import require
from layerscope.hooks import named_tensors
from layerscope.tensors._parts import is_parts_directory, read_parts
from layerscope.tensors._records import METADATA, Record
from layerscope.tensors._save import INDEX, read_records, write_records
from layerscope.tensors._values import first_value


class RecordSet:
    """Records of tensors, in the order they were kept."""

    def __init__(self, records: list[Record] | None = None) -> None:
        self._records: list[Record] = [] if records is None else records

    @property
    def records(self) -> list[Record]:
        """The records, in the order they were first kept (a new list)."""
        return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __getitem__(self, index: int) -> Record:
        return self._records[index]

    def clear(self) -> None:
        """Forget every record."""
        self._records = []

    def _info(self) -> dict[str, Any]:
        return {}

    def to_frame(
        self, stat: Callable[[Tensor], Any] = torch.std, stat_name: str | None = None
    ) -> Any:
        """A pandas DataFrame: one row per record, with ``stat`` of its value.

        A module's output kept whole (``record.whole``) gives a row per tensor in it, named
        as records of them would be (``out.0``, ``out.logits``). A value that is not a
        tensor (what ``stash`` or ``stash_value`` returned) has its type's name as ``dtype``
        and None as ``shape``; its statistic is taken of its first value (the first element
        of nested tuples and lists, as tensor_tracker's ``first_value``): ``stat`` of a
        tensor, a number as it is (a statistic already), None for anything else.

        Args:
            stat: a function of a tensor to a scalar (a 0-d tensor or a number); integer and
                bool values are given to it as float64.
            stat_name: the column's name; ``stat.__name__`` by default.

        Returns:
            Columns ``module, type, kind, tensor, step, phase, call, count, dtype, shape`` and
            the statistic's.
        """
        pandas = require("pandas", "dataframe")
        name: str = stat_name or getattr(stat, "__name__", None) or "stat"
        rows = []
        for record, value in _each_value(self._records):
            row: dict[str, Any] = record.metadata()
            if isinstance(value, Tensor):
                row["dtype"] = str(value.dtype).removeprefix("torch.")
                row["shape"] = tuple(value.shape)
            else:
                row["dtype"], row["shape"] = type(value).__name__, None
                value = first_value(value)
            result: Any = None
            if isinstance(value, Tensor):
                if not (value.is_floating_point() or value.is_complex()):
                    value = value.double()
                result = stat(value)
            elif isinstance(value, int | float):
                result = value
            row[name] = result.item() if isinstance(result, Tensor) else result
            rows.append(row)
        columns = [*METADATA, "dtype", "shape", name]
        return pandas.DataFrame(rows, columns=columns)

    def save(self, dir: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Write the records under ``dir``: safetensors value files and a JSON index.

        ``layerscope.load_capture(dir)`` reads them back, values bit for bit. Nothing is
        pickled: a value that is not a tensor is saved as JSON when it is a number, a string,
        None, or a tuple, list, str-keyed dict or mapping, namedtuple or dataclass of those
        and of tensors (a dataclass or mapping of its own class comes back as a
        ``SavedObject``); another object raises TypeError naming its record. Needs
        ``pip install 'layerscope[capture]'`` (safetensors).

        Args:
            dir: a directory; made if missing.
            overwrite: replace a capture already saved there (else FileExistsError).

        Returns:
            The directory.
        """
        return write_records(self._records, dir, self._info(), overwrite=overwrite)


def _each_value(records: list[Record]) -> Iterator[tuple[Record, Any]]:
    """Each record with its value, a whole output's tensors each as a record of its own."""
    for record in records:
        if not record.whole or isinstance(record.value, Tensor):
            yield record, record.value
            continue
        for name, tensor in named_tensors(record.value, record.tensor):
            yield replace(record, tensor=name, value=tensor, whole=False), tensor


class SavedCapture(RecordSet):
    """A capture read back by ``layerscope.load_capture``: its records and what made them."""

    def __init__(self, records: list[Record], info: dict[str, Any]) -> None:
        super().__init__(records)
        self.info = info

    def _info(self) -> dict[str, Any]:
        return dict(self.info)

    def __repr__(self) -> str:
        return f"SavedCapture(records={len(self._records)})"


def load_capture(
    dir: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> SavedCapture:
    """Read a capture that ``Capture.save(dir)`` wrote, or a run's ``tensors`` directory.

    Args:
        dir: the directory: one ``save()`` wrote, or ``<run>/tensors`` (``<run>/rank-00001/
            tensors`` for rank 1) where ``watch(tensors=...)`` kept whole tensors, also at
            an fsspec URL (``s3://bucket/run/rank-00001/tensors``).
        device: where the values go.
        storage_options: options of the URL's filesystem, as ``layerscope.load`` takes them.

    Returns:
        A ``SavedCapture`` with the same records, in the same order, values bit for bit;
        ``info`` holds the capture's options and counts (``skipped``, ``failures``).

    Examples:
        >>> import tempfile, torch, layerscope
        >>> model = torch.nn.Linear(3, 2)
        >>> with layerscope.capture(model) as cap:
        ...     model(torch.ones(4, 3)).sum().backward()
        >>> folder = tempfile.mkdtemp()
        >>> _ = cap.save(folder)
        >>> loaded = layerscope.load_capture(folder)
        >>> [(r.kind, r.tensor) for r in loaded.records]
        [('activation', 'out'), ('grad', 'out')]
        >>> torch.equal(loaded.records[0].value, cap.records[0].value)
        True
    """
    if storage_options is not None or not (Path(dir) / INDEX).exists():  # a run's, maybe a URL
        from layerscope.store.locations import location_filesystem

        fs, root = location_filesystem(dir, storage_options=storage_options)
        if is_parts_directory(fs, root.rstrip("/")):
            return SavedCapture(read_parts(fs, root.rstrip("/"), str(device)), {})
        if storage_options is not None:  # what save() writes is read from a local folder
            raise FileNotFoundError(f"dir: no run's whole tensors at {os.fspath(dir)}")
    records, info = read_records(dir, device)
    return SavedCapture(records, info)
