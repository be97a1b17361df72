"""Names in a run directory, and which Parquet files a reader should read.

    RUN/run.json          id, name, status, times, versions, configuration, counters
    RUN/modules.json      the module tree
    RUN/stats/            Parquet: seg-000001.parquet ... while running,
    RUN/scalars/          data-000001-000042.parquet once compacted at close
    RUN/alerts/
    RUN/attention/        one row per head of each attention call (watch(attention=True))
    RUN/calls.parquet     the call order of every recorded step, once per change
    RUN/rank-00001/       the same files, of rank 1 of a distributed job
    RUN/rank-00002/       ... one directory for each rank but rank 0

Rank 0, and a process that is not part of a distributed job, writes at the run's root; every
other rank writes the same layout in a directory of its own, named by ``rank_directory``, so
that no rank ever writes, compacts or removes another's files. A reader reads all of them as
one run. A run directory's entries named like ``rank-00001`` are taken for ranks, never for
runs of their own.

A segment appears only by rename, so a reader never sees half a file. Compaction writes the
merged file first and deletes the segments it covers afterwards; a reader skips segments that a
compacted file covers, so a crash between the two steps never shows a row twice.
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
MODULES_FILE = "modules.json"
CALLS_FILE = "calls.parquet"
SEGMENTED_TABLES = ("stats", "scalars", "alerts", "attention")
#: What a rank writes in its place; whole tensors (``watch(tensors=...)``) go in ``tensors``.
RUN_ENTRIES = frozenset((RUN_FILE, MODULES_FILE, CALLS_FILE, *SEGMENTED_TABLES, "tensors"))

_RANK_DIRECTORY = re.compile(r"^rank-(\d{5,})$")
_SEGMENT = re.compile(r"^seg-(\d{6,})\.parquet$")
_COMPACTED = re.compile(r"^data-(\d{6,})-(\d{6,})\.parquet$")


def rank_directory(rank: int) -> str:
    """Where rank ``rank`` writes, relative to the run's root: ``""`` (the root) for rank 0.

    Examples:
        >>> rank_directory(0), rank_directory(3)
        ('', 'rank-00003')
    """
    return "" if rank == 0 else f"rank-{rank:05d}"


def directory_rank(name: str) -> int | None:
    """The rank whose directory ``name`` is, or None for a name that is not a rank's.

    Examples:
        >>> directory_rank("rank-00003"), directory_rank("stats"), directory_rank("rank-00000")
        (3, None, None)
    """
    match = _RANK_DIRECTORY.match(name)
    rank = int(match.group(1)) if match else 0
    return rank or None  # rank 0 writes at the root, never in a directory of its own


def segment_name(index: int) -> str:
    """File name of segment ``index`` (from 1)."""
    return f"seg-{index:06d}.parquet"


def compacted_name(first: int, last: int) -> str:
    """File name of the compaction of segments ``first`` to ``last``."""
    return f"data-{first:06d}-{last:06d}.parquet"


def segment_range(name: str) -> tuple[int, int] | None:
    """Segments a file holds, as (first, last); None for a name that is not a table file."""
    match = _SEGMENT.match(name)
    if match:
        index = int(match.group(1))
        return index, index
    match = _COMPACTED.match(name)
    if match:
        return int(match.group(1)), int(match.group(2))
    return None


def files_to_read(names: list[str]) -> list[str]:
    """The table files to read, in segment order, skipping segments a compaction covers.

    Examples:
        >>> files_to_read(["seg-000003.parquet", "data-000001-000002.parquet",
        ...                "seg-000002.parquet", ".seg-000004.parquet.tmp"])
        ['data-000001-000002.parquet', 'seg-000003.parquet']
    """
    ranges = {name: segment_range(name) for name in names}
    compacted = [r for name, r in ranges.items() if r and name.startswith("data-")]
    keep = []
    for name, span in ranges.items():
        if span is None:
            continue
        covered = name.startswith("seg-") and any(a <= span[0] <= b for a, b in compacted)
        if not covered:
            keep.append((span, name))
    return [name for _, name in sorted(keep)]


def next_segment(names: list[str]) -> int:
    """The index the next segment gets: one past every segment there is."""
    spans = [span for span in map(segment_range, names) if span is not None]
    return max((last for _, last in spans), default=0) + 1
