"""Names in a run directory, and which Parquet files a reader should read.

    RUN/run.json          id, name, status, times, versions, configuration, counters
    RUN/modules.json      the module tree
    RUN/stats/            Parquet: seg-000001.parquet ... while running,
    RUN/scalars/          data-000001-000042.parquet once compacted at close
    RUN/alerts/
    RUN/calls.parquet     the call order of one forward pass

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
SEGMENTED_TABLES = ("stats", "scalars", "alerts")

_SEGMENT = re.compile(r"^seg-(\d{6,})\.parquet$")
_COMPACTED = re.compile(r"^data-(\d{6,})-(\d{6,})\.parquet$")


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

    Example:
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
