"""Throughput of the run store, and query latency over a large run.

    python benchmarks/store.py            # prints the figures
    python benchmarks/store.py --write    # also updates the store section of BENCHMARKS.md

- write: stat rows per second through ParquetStore.write + flush (Arrow conversion, trimmed
  histograms, lz4 Parquet segments, atomic renames), from chunks of finalised rows, until the
  last segment is on disk;
- finalise + write: the whole writer-thread path from device readings (merging, finalising)
  to Parquet, as the writer thread runs it;
- query: one module's series (step, mean) out of 10 million rows with ``Run.sql``, median of
  repeated runs, after the run is closed and compacted.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import layerscope
from layerscope.distributed._ranks import ProcessRank
from layerscope.model._identities import Form, Identities, Identity
from layerscope.model._kinds import Kind
from layerscope.recording._batches import Batch, arrive
from layerscope.recording._buffer import HostCopy
from layerscope.recording._readings import Readings
from layerscope.sinks import Records, RunInfo, RunSummary, StatsRows
from layerscope.stats import finalize
from layerscope.stats._layout import WIDTH
from layerscope.stats._selection import StatSelection
from layerscope.store import ParquetStore
from layerscope.writer._merging import finalize_merged, merge_batches
from report import replace_section

MODULES = [
    f"blocks.{b}.{part}" for b in range(12) for part in ("attn", "mlp.fc1", "mlp.fc2", "ln1", "ln2")
]
KINDS = ("activation", "grad", "weight", "weight_grad")


def _partials(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Plausible partials and log2 histograms: ~20 non-zero bins around 2**-3."""
    partials = torch.zeros(rows, WIDTH, dtype=torch.float64)
    partials[:, 0] = partials[:, 1] = 4096
    partials[:, 2] = torch.randn(rows, generator=generator, dtype=torch.float64)
    partials[:, 3] = 4096 * torch.rand(rows, generator=generator, dtype=torch.float64)
    partials[:, 4], partials[:, 5] = -3.0, 3.0
    partials[:, 9] = partials[:, 10] = 2048
    centre = torch.randint(110, 130, (rows, 1), generator=generator)
    offsets = torch.arange(-10, 10)
    hist = torch.zeros(rows, 256, dtype=torch.int64)
    hist.scatter_(1, centre + offsets, 200)
    return partials, hist


def _identities() -> tuple[Identities, list[int]]:
    """A 60-module model's identities, 4 kinds each: the rows of one recorded step."""
    identities = Identities()
    codes = [
        identities.code(Identity("train", module, "Linear", Kind(kind), "out", 0))
        for module in MODULES
        for kind in KINDS
    ]
    identities.form_code(Form("bfloat16", (8, 128, 768)))
    return identities, codes


def _chunk(
    first_step: int, rows: int, generator: torch.Generator, identities: Identities, codes: list[int]
) -> StatsRows:
    per_step = len(codes)
    partials, hist = _partials(rows, generator)
    stats = finalize(partials)
    index = torch.arange(rows)
    return StatsRows(
        step=first_step + index // per_step,
        identity=torch.tensor(codes)[index % per_step],
        form=torch.zeros(rows, dtype=torch.int64),
        identities=identities,
        rank=0,
        stats={
            "numel": stats["numel"],
            **{name: stats[name] for name in layerscope.stats.BUILTIN_STATS if name != "hist"},
        },
        hist=hist.double(),
    )


def _info() -> RunInfo:
    return RunInfo(
        id="bench",
        name="bench",
        started=time.time(),
        place=ProcessRank(),
        config={"stats": list(layerscope.stats.BUILTIN_STATS)},
        modules=[],
        histogram_edges=layerscope.stats.log2_bin_edges(),
    )


def _summary(steps: int, rows: int) -> RunSummary:
    return RunSummary(
        status="finished",
        ended=time.time(),
        steps=steps,
        recorded_rows=rows,
        dropped_rows=0,
        failures=0,
    )


def write_rate(directory: Path, rows: int, chunk_rows: int, flush_every: int) -> float:
    """Chunks as the writer gets them (one recorded step each), a segment every few steps.

    The chunks cycle through a pool of eight made beforehand, too many to stay in the cache.
    """
    generator = torch.Generator().manual_seed(0)
    identities, codes = _identities()
    per_step = len(codes)
    pool = [_chunk(0, chunk_rows, generator, identities, codes) for _ in range(8)]
    store = ParquetStore(directory / "write")
    store.start(_info())
    start = time.perf_counter()
    for index in range(rows // chunk_rows):
        chunk = pool[index % len(pool)]
        first_step = index * chunk_rows // per_step
        store.write(Records(stats=dataclasses.replace(chunk, step=chunk.step + first_step)))
        if index % flush_every == flush_every - 1:
            store.flush()
    store.flush()
    store.sync()  # the last segment is on disk
    elapsed = time.perf_counter() - start
    store.close(_summary(0, rows))
    return rows / elapsed


def finalise_and_write_rate(directory: Path, steps: int) -> float:
    """Readings of a 60-module model, 4 kinds, one step per batch, through the writer path."""
    generator = torch.Generator().manual_seed(1)
    per_step = len(MODULES) * len(KINDS)
    identities, codes = _identities()
    store = ParquetStore(directory / "finalise")
    store.start(_info())
    batches = []
    for step in range(steps):
        partials, hist = _partials(per_step, generator)
        payload = torch.cat([partials, hist.double()], dim=1).reshape(-1)
        readings = Readings()
        for i in range(per_step):
            readings.add(step, codes[i], 0, 0, i, False)
        batches.append(Batch(readings, {0: HostCopy(payload, per_step, WIDTH + 256, None)}))
    selection = StatSelection()
    start = time.perf_counter()
    for first in range(0, steps, 10):  # as the writer does: a segment's steps at once
        group = batches[first : first + 10]
        merged, _ = merge_batches(group, None, [arrive(batch) for batch in group])
        assert merged is not None
        store.write(Records(stats=finalize_merged(merged, 0, selection, identities)))
        store.flush()
    store.flush()
    store.sync()
    elapsed = time.perf_counter() - start
    store.close(_summary(steps, steps * per_step))
    return steps * per_step / elapsed


def query_time(directory: Path, rows: int, repeats: int) -> tuple[float, int]:
    generator = torch.Generator().manual_seed(2)
    identities, codes = _identities()
    store = ParquetStore(directory / "query")
    store.start(_info())
    chunk_rows = 1_000_080  # whole steps of 240 rows
    written = 0
    while written < rows:
        store.write(Records(stats=_chunk(written // 240, chunk_rows, generator, identities, codes)))
        store.flush()
        written += chunk_rows
    store.close(_summary(written // 240, written))
    run = layerscope.load(directory / "query")
    query = (
        "select step, mean from stats where module = 'blocks.7.mlp.fc1' "
        "and kind = 'activation' order by step"
    )
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        series = run.sql(query)
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(series)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows for the write rate")
    parser.add_argument("--query-rows", type=int, default=10_000_000)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        # The first run pays for the process's first allocations; the median of three does not.
        write = statistics.median(
            write_rate(directory / str(run), args.rows, chunk_rows=2_400, flush_every=10)
            for run in range(3)
        )
        finalise = statistics.median(
            finalise_and_write_rate(directory / f"f{run}", steps=500) for run in range(3)
        )
        query, found = query_time(directory, args.query_rows, repeats=7)
    lines = [
        "| measure | figure |",
        "|---|---|",
        "| write: stat rows per second (steps of 2,400 rows, a segment every 10), median of 3 "
        f"| {write:,.0f} |",
        "| finalise + write: rows per second (steps of 240 readings), median of 3 "
        f"| {finalise:,.0f} |",
        f"| query: one module's series of {found:,} rows out of "
        f"{args.query_rows / 1e6:.0f} million, median | {query * 1e3:.0f} ms |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        command = f"python benchmarks/store.py {' '.join(sys.argv[1:])}".strip()
        replace_section("Run store (CPU)", f"Command: `{command}`.\n\n{text}")


if __name__ == "__main__":
    main()
