"""Damaged and crafted run directories: each case a name and a function that damages a copy.

A case starts from a small real run (``make_bases``: a tiny MLP trained 4 steps, one segment
per step and table, a NaN at the last step so that the alerts table has a row; and the same
run with a rank 1 written beside it) and damages a copy in place. It also says which files a
reader should name when it cannot read them (paths relative to the run; a name ending in
``/`` is that folder or anything under it), and what the run should read as: by default
what the base run reads as; a ``reference`` makes a copy of the base into that (a compacted
run, say); a ``crafted`` case is a well-formed run with hostile content (SQL in names) and is
its own reference: any clean answer is right, and nothing may be injected.

Injected SQL writes ``INJECTED*.csv`` relative to the working directory: a reader that lets
any of it through leaves that file behind (see ``classify``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import layerscope
from layerscope.store import ParquetStore

#: The run's folder in every case: dashboards and listings name runs by folder.
RUN_FOLDER = "run"
#: The good run beside a damaged one, in the cases of a folder of runs.
GOOD_FOLDER = "good"
STEPS = 4
#: Written by SQL that got out of a string or an identifier; always a file name beginning so.
INJECTED_PREFIX = "INJECTED"
RANK_INJECTION = (
    "0 group by name; copy (select 'x' as x) to 'INJECTED.csv'; select 1 as name, "
    "1 as first_step, 1 as last_step, 1 as earliest, 1 as latest from scalars where 0 = 0"
)
MODULE_INJECTION = "x'); copy (select 1) to 'INJECTED2.csv'; --"
# Out of a double-quoted identifier (a statistic's column), and out of a number.
STAT_INJECTION = "mean\" from stats; copy (select 1) to 'INJECTED3.csv'; select \"mean"
CUSTOM_INJECTION = "x\" from stats; copy (select 1) to 'INJECTED4.csv'; select \"x"
STEPS_INJECTION = "1; copy (select 1) to 'INJECTED5.csv'; --"
RANKS_INJECTION = "0; copy (select 1) to 'INJECTED6.csv'; --"
# Values of string columns: quotes of both kinds, a way out of a literal, a backslash.
ROW_INJECTION = "it's \"q\" \\ x'); copy (select 1) to 'INJECTED7.csv'; --"
TENSOR_INJECTION = "out' or 1=1; copy (select 1) to 'INJECTED8.csv'; --"
SCALAR_INJECTION = "loss'); copy (select 1) to 'INJECTED9.csv'; --"

Damage = Callable[[Path], None]


@dataclass(frozen=True)
class Bases:
    """The good runs cases start from.

    Attributes:
        single: one process's run.
        ranked: the same training written by rank 0 and rank 1 (``rank-00001/``).
    """

    single: Path
    ranked: Path

    def of(self, case: Case) -> Path:
        return self.ranked if case.ranked else self.single


@dataclass(frozen=True)
class Case:
    """One damaged or crafted run.

    Attributes:
        name: unique, for test ids and the benchmark's table.
        family: which file it damages: ``run.json``, ``modules.json``, ``stats``...
        damage: damages the run folder it is given, in place.
        names: what a reader that cannot read the run should name, relative to the run.
        reference: makes a copy of the base into what the run should read as; None: the
            base as it is.
        crafted: a well-formed run with hostile content, its own reference.
        beside: the run lies in a folder beside a good run (``GOOD_FOLDER``).
        ranked: starts from the run of two ranks.
        params: the dashboard's parameters for this case, over those of the base run.
        folder: the run's folder name (its reference's is ``RUN_FOLDER``); a name in
            ``names``, ``"."`` is that folder itself.
        isolated: read in a process of its own, bounded in memory (``/dev/zero`` as a file).
        unprivileged: read as a user who is not root (see ``isolation``): files it may not
            read.
    """

    name: str
    family: str
    damage: Damage
    names: tuple[str, ...] = ()
    reference: Damage | None = None
    crafted: bool = False
    beside: bool = False
    ranked: bool = False
    params: Mapping[str, str] = field(default_factory=dict)
    folder: str = RUN_FOLDER
    isolated: bool = False
    unprivileged: bool = False


# ---------------------------------------------------------------- the base runs


def make_bases(folder: Path) -> Bases:
    """Write the base runs under ``folder`` (a few seconds): see ``Bases``."""
    single = _record(folder / "single" / RUN_FOLDER)
    ranked = folder / "ranked" / RUN_FOLDER
    for rank in (0, 1):
        with _environment(RANK=str(rank), WORLD_SIZE="2"):
            _record(ranked, seed=rank)
    for path in (single / SEGMENT["stats"], single / SEGMENT["alerts"], ranked / "rank-00001"):
        if not path.exists():
            raise RuntimeError(f"the base runs changed shape: no {path}; update corpus.py")
    return Bases(single, ranked)


def _record(path: Path, seed: int = 0) -> Path:
    """Train a tiny MLP ``STEPS`` steps, a segment per step and table, left uncompacted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.randn(STEPS, 5, 4, generator=torch.Generator().manual_seed(1 + seed))
    batches[-1, 0, 0] = float("nan")  # the nonfinite rule's alert: a row in the alerts table
    store = ParquetStore(path, flush_steps=1)
    # Uncompacted, a table has a file per step: a reader can lose one and keep the rest.
    with (
        mock.patch.object(ParquetStore, "_compact", return_value=None),
        warnings.catch_warnings(),
        contextlib.redirect_stderr(io.StringIO()),  # the alert's log line
    ):
        warnings.simplefilter("ignore")  # the alert's warning is wanted here
        with layerscope.watch(model, optimizer=optimizer, run=store, every=1) as scope:
            for batch in batches:
                loss = model(batch).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                scope.step(loss=loss, lr=0.1)
    return path


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build(
    case: Case, bases: Bases, folder: Path, prepare: Callable[[Path], None] | None = None
) -> Path:
    """The damaged run of ``case`` in ``folder/runs/<case.folder>``, a good run beside it if it
    says; ``prepare(folder)`` is called before the damage is done."""
    run = _copy_base(bases.of(case), folder, case.beside, case.folder)
    if prepare is not None:
        prepare(folder)
    case.damage(run)
    return run


def build_reference(case: Case, bases: Bases, folder: Path) -> Path:
    """What the run of ``case`` should read as, in ``folder/runs/run``."""
    run = _copy_base(bases.of(case), folder, case.beside)
    if case.crafted:
        case.damage(run)
    elif case.reference is not None:
        case.reference(run)
    return run


def reference_key(case: Case) -> tuple[Any, ...]:
    """Cases of one key share a reference run."""
    if case.crafted:
        return ("crafted", case.name)
    return (case.ranked, case.beside, case.reference)


def _copy_base(base: Path, folder: Path, beside: bool, name: str = RUN_FOLDER) -> Path:
    runs = folder / "runs"
    runs.mkdir(parents=True)
    if beside:
        shutil.copytree(base, runs / GOOD_FOLDER)
    return Path(shutil.copytree(base, runs / name))


# ---------------------------------------------------------------- damages


def _meta(place: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((place / "run.json").read_text())
    return meta


def _write_meta(place: Path, meta: Any) -> None:
    (place / "run.json").write_text(json.dumps(meta, indent=1))


def set_fields(**fields: Any) -> Damage:
    """``run.json`` with these top-level fields set."""

    def damage(run: Path) -> None:
        _write_meta(run, {**_meta(run), **fields})

    return damage


def set_config(**fields: Any) -> Damage:
    """``run.json`` with these fields of ``config`` set."""

    def damage(run: Path) -> None:
        meta = _meta(run)
        meta["config"] = {**meta["config"], **fields}
        _write_meta(run, meta)

    return damage


def add_to_config(name: str, value: Any) -> Damage:
    """``run.json`` with ``value`` appended to the list ``config[name]``."""

    def damage(run: Path) -> None:
        meta = _meta(run)
        meta["config"][name] = [*meta["config"].get(name, ()), value]
        _write_meta(run, meta)

    return damage


def write_json(relative: str, value: Any) -> Damage:
    def damage(run: Path) -> None:
        (run / relative).write_text(json.dumps(value))

    return damage


def write_bytes(relative: str, payload: bytes) -> Damage:
    def damage(run: Path) -> None:
        (run / relative).write_bytes(payload)

    return damage


def truncate(relative: str) -> Damage:
    """The file cut to its first half."""

    def damage(run: Path) -> None:
        payload = (run / relative).read_bytes()
        (run / relative).write_bytes(payload[: len(payload) // 2])

    return damage


def latin1_run_json(run: Path) -> None:
    """Valid JSON, but Latin-1 where it should be UTF-8: a lone 0xE9 byte."""
    meta = _meta(run)
    meta["name"] = "café"
    (run / "run.json").write_bytes(json.dumps(meta, ensure_ascii=False).encode("latin-1"))


def latin1_modules_json(run: Path) -> None:
    entries = json.loads((run / "modules.json").read_text())
    entries[1]["type"] = "Liné"
    (run / "modules.json").write_bytes(json.dumps(entries, ensure_ascii=False).encode("latin-1"))


def remove(relative: str) -> Damage:
    def damage(run: Path) -> None:
        path = run / relative
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()

    return damage


def directory_instead(relative: str) -> Damage:
    """A directory where the file should be."""

    def damage(run: Path) -> None:
        (run / relative).unlink()
        (run / relative).mkdir()

    return damage


def file_instead(relative: str) -> Damage:
    """A file where the folder should be."""

    def damage(run: Path) -> None:
        shutil.rmtree(run / relative)
        (run / relative).write_text("not a folder\n")

    return damage


def empty_folder(relative: str) -> Damage:
    def damage(run: Path) -> None:
        for path in (run / relative).iterdir():
            path.unlink()

    return damage


def copy(relative: str, to: str) -> Damage:
    def damage(run: Path) -> None:
        shutil.copyfile(run / relative, run / to)

    return damage


def other_parquet(relative: str) -> Damage:
    """A Parquet file, but of another program's columns."""

    def damage(run: Path) -> None:
        pq.write_table(pa.table({"a": [1, 2]}), run / relative)

    return damage


def string_steps(relative: str) -> Damage:
    """The file rewritten with its ``step`` column as strings ("0", "1", ...)."""

    def damage(run: Path) -> None:
        _rewrite(run / relative, {"step": lambda column: column.cast(pa.string())})

    return damage


def _rewrite(path: Path, columns: Mapping[str, Callable[[Any], Any]]) -> None:
    """The Parquet file at ``path`` with these columns changed, its footer's metadata kept."""
    table = pq.read_table(path)
    for name, change in columns.items():
        if name in table.column_names:
            index = table.column_names.index(name)
            table = table.set_column(index, name, change(table.column(name)))
    pq.write_table(table, path)


def _replaced(values: Mapping[str, str]) -> Callable[[Any], Any]:
    """A column's strings mapped through ``values`` (others kept), in the column's type."""

    def change(column: Any) -> Any:
        kind = column.type
        plain = column.cast(pa.string()) if pa.types.is_dictionary(kind) else column
        mapped = pa.array([values.get(value, value) for value in plain.to_pylist()], pa.string())
        return mapped.dictionary_encode() if pa.types.is_dictionary(kind) else mapped

    return change


def _every_value(value: str) -> Callable[[Any], Any]:
    def change(column: Any) -> Any:
        strings = [None if item is None else value for item in column.to_pylist()]
        plain = pa.array(strings, pa.string())
        return plain.dictionary_encode() if pa.types.is_dictionary(column.type) else plain

    return change


def _table_files(run: Path) -> Iterator[Path]:
    """Every Parquet file of every table of every rank of the run."""
    yield from sorted(run.rglob("*.parquet"))


def rename_module(old: str, new: str, rows: bool) -> Damage:
    """Module ``old`` named ``new`` in modules.json, and in every table's rows if ``rows``."""

    def damage(run: Path) -> None:
        for listing in run.rglob("modules.json"):
            entries = json.loads(listing.read_text())
            for entry in entries:
                if entry["name"] == old:
                    entry["name"] = new
                entry["children"] = [new if child == old else child for child in entry["children"]]
            listing.write_text(json.dumps(entries))
        if rows:
            for path in _table_files(run):
                _rewrite(path, {"module": _replaced({old: new})})

    return damage


def replace_values(relative: str, **columns: str) -> Damage:
    """The file's rows with every value of these string columns replaced."""

    def damage(run: Path) -> None:
        _rewrite(run / relative, {name: _every_value(value) for name, value in columns.items()})

    return damage


def replace_in_tables(table: str, column: str, old: str, new: str) -> Damage:
    """Value ``old`` of ``column`` as ``new`` in every file of ``table``."""

    def damage(run: Path) -> None:
        for path in sorted((run / table).glob("*.parquet")):
            _rewrite(path, {column: _replaced({old: new})})

    return damage


def compacted(run: Path) -> None:
    """Every table compacted into one file per rank, as a writer does at close."""
    from layerscope._imports import require
    from layerscope.store._compaction import compact

    filesystem = require("fsspec", "dataframe").filesystem("file")
    for table in ("stats", "scalars", "alerts"):
        for directory in sorted(run.rglob(table)):
            if directory.is_dir():
                compact(filesystem, str(directory))


def then(*damages: Damage) -> Damage:
    def damage(run: Path) -> None:
        for each in damages:
            each(run)

    return damage


def rank_copied_from_root(rank_in_json: int | None) -> Damage:
    """``rank-00001/`` holding copies of rank 0's files (rank 0's rows inside it)."""

    def damage(run: Path) -> None:
        place = run / "rank-00001"
        place.mkdir()
        for name in ("run.json", "modules.json", "calls.parquet"):
            shutil.copyfile(run / name, place / name)
        for table in ("stats", "scalars", "alerts"):
            shutil.copytree(run / table, place / table)
        if rank_in_json is not None:
            _write_meta(place, {**_meta(place), "rank": rank_in_json})

    return damage


def keep_segments_of(relative: str) -> Damage:
    """A table's segment left beside its compacted file (a crash before they were removed)."""

    def damage(run: Path) -> None:
        shutil.copyfile(run / relative, run / "kept-segment")
        compacted(run)
        (run / "kept-segment").rename(run / relative)

    return damage


# ---------------------------------------------------------------- the corpus

#: The segment of each table that the segment cases damage; stats and scalars have more.
SEGMENT = {
    "stats": "stats/seg-000002.parquet",
    "scalars": "scalars/seg-000002.parquet",
    "alerts": "alerts/seg-000001.parquet",
}
COMPACTED_STATS = f"stats/data-000001-{STEPS:06d}.parquet"
GARBAGE = b"this is not a parquet file\x00\xff" * 8


def _run_json_cases() -> list[Case]:
    fields: list[tuple[str, Damage]] = [
        ("run.json-list", write_json("run.json", [])),
        ("run.json-null", write_json("run.json", None)),
        ("run.json-string", write_json("run.json", "hello")),
        ("run.json-only-schema-abc", write_json("run.json", {"schema": "abc"})),
        ("run.json-schema-abc", set_fields(schema="abc")),
        ("run.json-schema-99", set_fields(schema=99)),
        ("run.json-started-yesterday", set_fields(started="yesterday")),
        ("run.json-steps-abc", set_fields(steps="abc")),
        ("run.json-steps-infinite", set_fields(steps=float("inf"))),
        ("run.json-steps-negative", set_fields(steps=-5)),
        ("run.json-status-number", set_fields(status=5)),
        ("run.json-config-x", set_fields(config="x")),
        ("run.json-config-stats-string", set_config(stats="mean")),
        ("run.json-config-kinds-ints", set_config(kinds=[1, 2])),
        ("run.json-config-capture-ints", set_config(capture=[1, 2])),  # a run before kinds=
        ("run.json-histogram-edges-1-2", set_fields(histogram_edges=[1, 2])),
        ("run.json-histogram-edges-string", set_fields(histogram_edges="abc")),
        ("run.json-versions-list", set_fields(versions=[1, 2])),
        ("run.json-rank-injection", set_fields(rank=RANK_INJECTION)),
        ("run.json-config-stats-injection", add_to_config("stats", STAT_INJECTION)),
        ("run.json-custom-stats-injection", add_to_config("custom_stats", CUSTOM_INJECTION)),
        ("run.json-steps-injection", set_fields(steps=STEPS_INJECTION)),
        ("run.json-ranks-injection", set_fields(ranks=[{"rank": RANKS_INJECTION}])),
        ("run.json-world-size-injection", set_fields(world_size=RANKS_INJECTION)),
        ("run.json-truncated", truncate("run.json")),
        ("run.json-empty", write_bytes("run.json", b"")),
        ("run.json-not-utf8", latin1_run_json),
        ("run.json-directory", directory_instead("run.json")),
        ("run.json-missing", remove("run.json")),
    ]
    return [Case(name, "run.json", damage, ("run.json",)) for name, damage in fields]


def _without(name: str) -> Damage:
    def damage(run: Path) -> None:
        entries = json.loads((run / "modules.json").read_text())
        for entry in entries:
            entry.pop(name)
        (run / "modules.json").write_text(json.dumps(entries))

    return damage


def _parameters_list(run: Path) -> None:
    entries = json.loads((run / "modules.json").read_text())
    entries[1]["parameters"] = [1]
    (run / "modules.json").write_text(json.dumps(entries))


def _duplicated_modules(run: Path) -> None:
    entries = json.loads((run / "modules.json").read_text())
    (run / "modules.json").write_text(json.dumps(entries + entries))


def _modules_cases() -> list[Case]:
    damages: list[tuple[str, Damage]] = [
        ("modules.json-no-type", _without("type")),
        ("modules.json-parameters-list", _parameters_list),
        ("modules.json-ints", write_json("modules.json", [1, 2, 3])),
        ("modules.json-object", write_json("modules.json", {})),
        ("modules.json-duplicated", _duplicated_modules),
        ("modules.json-truncated", truncate("modules.json")),
        ("modules.json-empty", write_bytes("modules.json", b"")),
        ("modules.json-not-utf8", latin1_modules_json),
        ("modules.json-directory", directory_instead("modules.json")),
        ("modules.json-missing", remove("modules.json")),
    ]
    cases = [Case(name, "modules.json", damage, ("modules.json",)) for name, damage in damages]
    cases.append(
        Case(
            "modules.json-name-injection",
            "modules.json",
            rename_module("0", MODULE_INJECTION, rows=False),
            crafted=True,
            params={"module": MODULE_INJECTION},
        )
    )
    return cases


def _table_cases(table: str) -> list[Case]:
    segment = SEGMENT[table]
    damages: list[tuple[str, Damage]] = [
        (f"{table}-segment-garbage", write_bytes(segment, GARBAGE)),
        (f"{table}-segment-empty", write_bytes(segment, b"")),
        (f"{table}-segment-truncated", truncate(segment)),
        (f"{table}-segment-other-columns", other_parquet(segment)),
        (f"{table}-segment-string-steps", string_steps(segment)),
    ]
    cases = [Case(name, table, damage, (segment, table)) for name, damage in damages]
    for copied in ("seg-000099.parquet", "data-000099-000099.parquet"):
        # Either may be named: the copy, or the segment it copies.
        cases.append(
            Case(
                f"{table}-copied-as-{copied.removesuffix('.parquet')}",
                table,
                copy(segment, f"{table}/{copied}"),
                (segment, f"{table}/{copied}", table),
            )
        )
    cases += [
        Case(f"{table}-folder-emptied", table, empty_folder(table), (table,)),
        Case(f"{table}-folder-missing", table, remove(table), (table,)),
        Case(f"{table}-file-instead-of-folder", table, file_instead(table), (table,)),
    ]
    return cases


def _calls_cases() -> list[Case]:
    names = ("calls.parquet",)
    return [
        Case("calls-garbage", "calls", write_bytes("calls.parquet", GARBAGE), names),
        Case("calls-empty", "calls", write_bytes("calls.parquet", b""), names),
        Case("calls-other-columns", "calls", other_parquet("calls.parquet"), names),
        Case("calls-directory", "calls", directory_instead("calls.parquet"), names),
    ]


def _compacted_cases() -> list[Case]:
    names = (COMPACTED_STATS, "stats")
    return [
        Case("compacted-control", "compacted", compacted, reference=compacted),
        Case(
            "compacted-data-garbage",
            "compacted",
            then(compacted, write_bytes(COMPACTED_STATS, GARBAGE)),
            names,
            reference=compacted,
        ),
        Case(
            "compacted-data-copied-as-seg-000099",
            "compacted",
            then(compacted, copy(COMPACTED_STATS, "stats/seg-000099.parquet")),
            (*names, "stats/seg-000099.parquet"),
            reference=compacted,
        ),
        Case(
            "compacted-segment-left-beside",
            "compacted",
            keep_segments_of(SEGMENT["stats"]),
            (*names, SEGMENT["stats"]),
            reference=compacted,
        ),
    ]


def _control_cases() -> list[Case]:
    return [
        Case("control-untouched", "control", lambda run: None),
        Case(
            "control-temporary-file",
            "control",
            write_bytes("stats/.seg-000005.parquet.tmp", GARBAGE),
        ),
        Case("control-other-file", "control", write_bytes("stats/notes.txt", b"hello\n")),
    ]


def _crafted_rows_cases() -> list[Case]:
    return [
        Case(
            "rows-module-injection",
            "rows",
            rename_module("0", ROW_INJECTION, rows=True),
            crafted=True,
            params={"module": ROW_INJECTION},
        ),
        Case(
            "rows-tensor-injection",
            "rows",
            then(*(replace_in_tables(t, "tensor", "out", TENSOR_INJECTION) for t in SEGMENT)),
            crafted=True,
            params={"tensor": TENSOR_INJECTION},
        ),
        Case(
            "rows-kind-phase-injection",
            "rows",
            replace_values(SEGMENT["stats"], kind=ROW_INJECTION, phase=ROW_INJECTION),
            crafted=True,
        ),
        Case(
            "rows-scalar-name-injection",
            "rows",
            replace_in_tables("scalars", "name", "loss", SCALAR_INJECTION),
            crafted=True,
        ),
        Case(
            "rows-alert-injection",
            "rows",
            replace_values(
                SEGMENT["alerts"],
                rule=ROW_INJECTION,
                module=ROW_INJECTION,
                message=ROW_INJECTION,
                severity=ROW_INJECTION,
            ),
            crafted=True,
        ),
    ]


def _rank_cases() -> list[Case]:
    rank_files = ("rank-00001/",)
    return [
        Case(
            "rank-copied-from-rank-0",
            "ranks",
            rank_copied_from_root(None),
            rank_files,
        ),
        Case(
            "rank-copied-from-rank-0-json-rank-1",
            "ranks",
            rank_copied_from_root(1),
            rank_files,
        ),
        Case("rank-control", "ranks", lambda run: None, ranked=True),
        Case(
            "rank-run.json-garbage",
            "ranks",
            write_bytes("rank-00001/run.json", GARBAGE),
            ("rank-00001/run.json",),
            ranked=True,
        ),
        Case(
            "rank-run.json-missing",
            "ranks",
            remove("rank-00001/run.json"),
            ("rank-00001/run.json", "rank-00001"),
            ranked=True,
        ),
        Case(
            "rank-stats-garbage",
            "ranks",
            write_bytes("rank-00001/stats/seg-000001.parquet", GARBAGE),
            ("rank-00001/stats/seg-000001.parquet", "rank-00001/stats"),
            ranked=True,
        ),
    ]


def _beside_cases() -> list[Case]:
    damages: list[tuple[str, Damage, tuple[str, ...]]] = [
        ("beside-run.json-garbage", write_bytes("run.json", GARBAGE), ("run.json",)),
        ("beside-run.json-schema-99", set_fields(schema=99), ("run.json",)),
        ("beside-run.json-missing", remove("run.json"), ("run.json",)),
        ("beside-modules.json-garbage", write_bytes("modules.json", GARBAGE), ("modules.json",)),
        ("beside-stats-emptied", empty_folder("stats"), ("stats",)),
    ]
    return [Case(name, "beside", damage, names, beside=True) for name, damage, names in damages]


CASES: tuple[Case, ...] = (
    *_run_json_cases(),
    *_modules_cases(),
    *(case for table in SEGMENT for case in _table_cases(table)),
    *_calls_cases(),
    *_compacted_cases(),
    *_control_cases(),
    *_crafted_rows_cases(),
    *_rank_cases(),
    *_beside_cases(),
)
BY_NAME = {case.name: case for case in CASES}
if len(BY_NAME) != len(CASES):
    raise RuntimeError("two cases of one name")
