"""Runs whose files are no files, hang or flood a reader, lie past their footer, may not be read,
sit in a folder whose name is a pattern, or hold terminal escapes: the damages of the corpus's
second part (the first is ``corpus.CASES``).

- Named pipes as ``run.json``, ``modules.json``, a segment and ``calls.parquet``: a reader that
  opens one blocks until someone writes (``isolation`` releases it after its time, as a hang).
- ``/dev/zero`` (a link to it, a device file of its kind) as a file: a reader that reads it
  reads without end, so these cases read in a process bounded in memory; ``/dev/null`` as one.
- A segment whose footer is sound but whose data pages are not, and one whose footer claims
  2**62 rows.
- Files and folders this user may not read (read as a user who is not root, see ``isolation``).
- A run in a folder named ``a?``, ``a*``, ``exp[1]`` or ``a::b``, beside runs named ``a1``,
  ``ab`` and ``exp1`` that a pattern would take: the run must read as its own rows, and the
  listing list each run once.
- ESC sequences (an OSC-8 hyperlink, a screen clear) in a run's name, host and a module's name:
  well-formed runs, so any clean answer is right, but no command may print a raw ESC byte.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import corpus
import pyarrow.compute as pc
import pyarrow.parquet as pq
from corpus import SEGMENT, Case, Damage

#: A hyperlink (OSC 8) around the text, a screen clear, colours: what a terminal obeys.
HYPERLINK = "\x1b]8;;https://example.invalid/\x1b\\click\x1b]8;;\x1b\\"
SCREEN_CLEAR = "\x1b[2J\x1b[H"
COLOURED = "\x1b[31mred\x1b[0m"
#: Folders whose names a pattern or an fsspec chain would read as more than one path.
PATTERN_FOLDERS = ("a?", "a*", "exp[1]", "a::b")
#: Runs beside them that those patterns would take: files of the same names, other values.
DECOYS = ("a1", "ab", "exp1")
_DEVICES = {"null": os.makedev(1, 3), "zero": os.makedev(1, 5)}


def fifo(relative: str) -> Damage:
    """A named pipe where the file was."""

    def damage(run: Path) -> None:
        (run / relative).unlink()
        os.mkfifo(run / relative)

    return damage


def link_to(relative: str, target: str) -> Damage:
    """A symbolic link to ``target`` (a device) where the file was."""

    def damage(run: Path) -> None:
        (run / relative).unlink()
        (run / relative).symlink_to(target)

    return damage


def device(relative: str, kind: str) -> Damage:
    """A character device like ``/dev/<kind>`` where the file was; a link to it where this
    user may not make devices."""

    def damage(run: Path) -> None:
        (run / relative).unlink()
        try:
            os.mknod(run / relative, 0o644 | stat.S_IFCHR, _DEVICES[kind])
        except PermissionError:
            (run / relative).symlink_to(f"/dev/{kind}")

    return damage


def corrupt_pages(relative: str) -> Damage:
    """The middle half of the file's data pages overwritten; its footer left as it was."""

    def damage(run: Path) -> None:
        path = run / relative
        data = bytearray(path.read_bytes())
        footer = int.from_bytes(data[-8:-4], "little")
        pages = len(data) - 8 - footer  # "PAR1", column chunks, footer, its length, "PAR1"
        start, end = 4 + (pages - 4) // 4, 4 + 3 * (pages - 4) // 4
        data[start:end] = b"\xff" * (end - start)
        path.write_bytes(bytes(data))

    return damage


def rows_claimed(relative: str, rows: int) -> Damage:
    """The footer's count of the file's rows (FileMetaData.num_rows) set to ``rows``."""

    def damage(run: Path) -> None:
        path = run / relative
        data = path.read_bytes()
        held = pq.ParquetFile(path).metadata.num_rows
        length = int.from_bytes(data[-8:-4], "little")
        footer = data[-8 - length : -8]
        # Thrift's compact form: field 3 (an i64, header 0x16), zigzag varint, then field 4
        # (the row groups' list, header 0x19).
        old = b"\x16" + _varint(held * 2) + b"\x19"
        if old not in footer:
            raise RuntimeError(f"no row count {held} found in {path}'s footer: update corpus")
        footer = footer.replace(old, b"\x16" + _varint(rows * 2) + b"\x19", 1)
        path.write_bytes(data[: -8 - length] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
        if pq.ParquetFile(path).metadata.num_rows != rows:
            raise RuntimeError(f"{path}: the footer's row count was not changed: update corpus")

    return damage


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def unreadable(relative: str) -> Damage:
    """The file or folder readable by no one but root."""

    def damage(run: Path) -> None:
        (run / relative).chmod(0)

    return damage


def with_decoys(run: Path) -> None:
    """Runs beside ``run`` that a pattern of its folder's name would take: each a copy of the
    base whose statistics and scalars hold other values, in files of the same names."""
    for name in DECOYS:
        decoy = run.parent / name
        shutil.copytree(run, decoy)
        for table, column in (("stats", "mean"), ("scalars", "value")):
            for path in sorted((decoy / table).glob("*.parquet")):
                corpus._rewrite(path, {column: lambda values: pc.add(values, 1000.0)})
        corpus.set_fields(name=name)(decoy)


def named_as_folder(run: Path) -> None:
    """The run's name its folder's, as ``watch(run=...)`` names it; runs beside it."""
    corpus.set_fields(name=run.name)(run)
    with_decoys(run)


def _pipes() -> list[Case]:
    stats = SEGMENT["stats"]
    return [
        Case("fifo-run.json", "pipes", fifo("run.json"), ("run.json",)),
        Case("fifo-modules.json", "pipes", fifo("modules.json"), ("modules.json",)),
        Case("fifo-stats-segment", "pipes", fifo(stats), (stats, "stats")),
        Case("fifo-calls.parquet", "pipes", fifo("calls.parquet"), ("calls.parquet",)),
    ]


def _devices() -> list[Case]:
    stats = SEGMENT["stats"]
    return [
        Case(
            "run.json-link-to-dev-zero",
            "devices",
            link_to("run.json", "/dev/zero"),
            ("run.json",),
            isolated=True,
        ),
        Case(
            "stats-segment-link-to-dev-zero",
            "devices",
            link_to(stats, "/dev/zero"),
            (stats, "stats"),
            isolated=True,
        ),
        Case(
            "modules.json-device-zero",
            "devices",
            device("modules.json", "zero"),
            ("modules.json",),
            isolated=True,
        ),
        Case(
            "calls-device-null",
            "devices",
            device("calls.parquet", "null"),
            ("calls.parquet",),
        ),
    ]


def _pages() -> list[Case]:
    stats, scalars = SEGMENT["stats"], SEGMENT["scalars"]
    return [
        Case("stats-segment-corrupt-pages", "pages", corrupt_pages(stats), (stats, "stats")),
        Case(
            "scalars-segment-corrupt-pages", "pages", corrupt_pages(scalars), (scalars, "scalars")
        ),
        Case(
            "stats-segment-footer-claims-2**62-rows",
            "pages",
            rows_claimed(stats, 2**62),
            (stats, "stats"),
            isolated=True,
        ),
    ]


def _permissions() -> list[Case]:
    stats = SEGMENT["stats"]
    return [
        Case(
            "rank-folder-unreadable",
            "permissions",
            unreadable("rank-00001"),
            ("rank-00001/",),
            ranked=True,
            unprivileged=True,
        ),
        Case(
            "stats-folder-unreadable",
            "permissions",
            unreadable("stats"),
            ("stats",),
            unprivileged=True,
        ),
        Case(
            "stats-segment-unreadable",
            "permissions",
            unreadable(stats),
            (stats, "stats"),
            unprivileged=True,
        ),
        Case(
            "run.json-unreadable",
            "permissions",
            unreadable("run.json"),
            ("run.json",),
            unprivileged=True,
        ),
    ]


def _paths() -> list[Case]:
    return [
        Case(
            f"folder-named-{folder}",
            "paths",
            named_as_folder,
            reference=with_decoys,
            folder=folder,
        )
        for folder in PATTERN_FOLDERS
    ]


def _escapes() -> list[Case]:
    module = f"{SCREEN_CLEAR}enc{HYPERLINK}"
    return [
        Case(
            "escapes-in-run-name",
            "escapes",
            corpus.set_fields(name=f"run{HYPERLINK}{SCREEN_CLEAR}"),
            crafted=True,
        ),
        Case("escapes-in-host", "escapes", corpus.set_fields(host=f"{COLOURED}host"), crafted=True),
        Case(
            "escapes-in-module-name",
            "escapes",
            corpus.rename_module("0", module, rows=True),
            crafted=True,
            params={"module": module},
        ),
    ]


CASES: tuple[Case, ...] = (
    *_pipes(),
    *_devices(),
    *_pages(),
    *_permissions(),
    *_paths(),
    *_escapes(),
)
