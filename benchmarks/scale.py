"""The readers on runs of millions of rows: each one's time and peak memory.

    python benchmarks/scale.py                              # 1 M and 10 M rows, prints the table
    python benchmarks/scale.py --sizes 1M,10M,50M --write   # also updates BENCHMARKS.md
    python benchmarks/scale.py --quick                      # a tiny run: every reader answers

Each size is a run of a data-parallel job (``--ranks`` ranks of a model of ``--modules``
Linear layers, 4 kinds, every step recorded, log2 histograms), each rank's files written by
the store's own writer (``synthetic.write_ranks``). A second run of the same shape, for
``diff``, holds the same files (hard links; its ``run.json`` files name it ``b``).

Each reader runs in a process of its own, under a limit of ``--memory-gb`` of address space
(``RLIMIT_AS``) and ``--timeout`` seconds, so that a runaway reader fails fast rather than
swapping: it is reported "over 8 GB" or "over 120 s", and not run again at larger sizes. The
time of a command or a Python reader is its process's wall time, start and imports included,
as a user waits for it; a route's is the one request's, the first to a fresh app (the
dashboard's server starts once). The peak is the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from report import command, machine, replace_section

HERE = Path(__file__).resolve()
KINDS = 4
SECTION = "Readers at scale (CPU)"
TARGET_SECONDS, TARGET_MB = 10.0, 2048.0
SQL = "select module, kind, max(l2) as l2 from stats group by 1, 2"
# The ranks merged in DuckDB: std makes it merge means and spreads (Chan's formula); all of
# the run, and one module's series (its filter reaches the files before the merge).
MERGED_SQL = "select module, kind, max(std) as std from merged_stats group by 1, 2"
SERIES_SQL = "select step, std from merged_stats where module = 'layers.0' and kind = 'activation'"
CHART = "kind=activation&phase=train&rank=0&tensor=out"
# What a reader stopped by its memory limit says, whichever library failed to allocate
# (glibc, for a thread's stack or thread-local data, among them); compared in lower case.
OUT_OF_MEMORY = (
    "memoryerror",
    "out of memory",
    "bad_alloc",
    "cannot allocate memory",
    "failed to allocate",
    "unable to allocate",
)


@dataclass(frozen=True)
class Shape:
    """A run of ``ranks`` ranks by ``modules`` layers by ``steps`` recorded steps."""

    ranks: int
    modules: int
    steps: int

    @property
    def rows(self) -> int:
        return self.ranks * self.modules * KINDS * self.steps

    @property
    def folder(self) -> str:
        return f"{self.ranks}x{self.modules}x{self.steps}"


@dataclass(frozen=True)
class Reader:
    """One thing that reads a run, as a process's command line in the folder of runs."""

    label: str
    argv: Callable[[Path], list[str]]
    rows: Callable[[Shape], int] | None = None  # the rows a Python reader must give back
    prints_json: bool = True  # a Python reader's answer; a command prints text


def _python(reader: str) -> Callable[[Path], list[str]]:
    return lambda folder: [sys.executable, str(HERE), "--child", reader, str(folder)]


def _cli(*arguments: str) -> Callable[[Path], list[str]]:
    def argv(folder: Path) -> list[str]:
        paths = [str(folder / name) if name in ("a", "b", ".") else name for name in arguments]
        return [sys.executable, "-m", "layerscope", *paths]

    return argv


READERS = {
    "open": Reader("`layerscope.load(run)`: start, imports, open", _python("open")),
    "sql": Reader(f'`load(run).sql("{SQL}")`', _python("sql"), lambda shape: shape.modules * KINDS),
    "stats": Reader(
        "`load(run).stats` (pandas; over a million rows refused)",
        _python("stats"),
        lambda shape: shape.rows,
    ),
    "merged": Reader(
        '`load(run, ranks="merge").stats` (likewise)',
        _python("merged"),
        lambda shape: shape.rows // shape.ranks,
    ),
    "merged-sql": Reader(
        f'`load(run).sql("{MERGED_SQL}")`',
        _python("merged-sql"),
        lambda shape: shape.modules * KINDS,
    ),
    "merged-series": Reader(
        f'`load(run).sql("{SERIES_SQL}")`',
        _python("merged-series"),
        lambda shape: shape.steps,
    ),
    "summary": Reader(
        "`layerscope summary RUN --plain`", _cli("summary", "a", "--plain"), prints_json=False
    ),
    "diff": Reader(
        "`layerscope diff RUN RUN2 --plain`", _cli("diff", "a", "b", "--plain"), prints_json=False
    ),
    "runs": Reader(
        "`layerscope runs FOLDER --plain` (2 runs)", _cli("runs", ".", "--plain"), prints_json=False
    ),
    "route-runs": Reader("`GET /api/runs`", _python("route-runs")),
    "route-run": Reader("`GET /api/runs/RUN` (overview)", _python("route-run")),
    "route-heatmap": Reader(
        "`GET /api/runs/RUN/heatmap?stat=absmax&...`", _python("route-heatmap")
    ),
    "route-series": Reader(
        "`GET /api/runs/RUN/series?module=layers.0&...`", _python("route-series")
    ),
    "route-colordim": Reader(
        "`GET /api/runs/RUN/colordim?module=layers.0&...`", _python("route-colordim")
    ),
}
ROUTES = {
    "route-runs": "/api/runs",
    "route-run": "/api/runs/a",
    "route-heatmap": f"/api/runs/a/heatmap?stat=absmax&{CHART}",
    "route-series": f"/api/runs/a/series?module=layers.0&{CHART}",
    "route-colordim": f"/api/runs/a/colordim?module=layers.0&{CHART}",
}


# ------------------------------------------------------------------ in the reader's process


def _child(reader: str, folder: str) -> None:
    """Read run ``a`` of ``folder`` as ``reader`` does; print what came back as JSON."""
    import layerscope

    run = str(Path(folder) / "a")
    if reader in ROUTES:
        print(json.dumps(_request(Path(folder), ROUTES[reader])))
    elif reader == "open":
        layerscope.load(run)
        print(json.dumps({}))
    elif reader == "sql":
        print(json.dumps({"rows": len(layerscope.load(run).sql(SQL))}))
    elif reader in ("merged-sql", "merged-series"):
        query = MERGED_SQL if reader == "merged-sql" else SERIES_SQL
        print(json.dumps({"rows": len(layerscope.load(run).sql(query))}))
    elif reader in ("stats", "merged"):
        loaded = layerscope.load(run, ranks="merge" if reader == "merged" else "each")
        try:
            print(json.dumps({"rows": len(loaded.stats)}))
        except layerscope.store.FrameTooLargeError as error:  # the answer past the limit
            print(json.dumps({"refused": error.rows}))
    else:
        raise SystemExit(f"no reader {reader!r}")


def _request(folder: Path, path: str) -> dict[str, float | int]:
    """The first request to a fresh app on ``folder``: its status, size and seconds."""
    from starlette.testclient import TestClient

    from layerscope.ui._app import create_app

    # Long reads are measured, not answered 503 by the app's own deadline.
    app = create_app(folder, deadline=24 * 3600.0)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        begin = time.perf_counter()
        response = client.get(path)
        seconds = time.perf_counter() - begin
    return {"status": response.status_code, "bytes": len(response.content), "seconds": seconds}


# ------------------------------------------------------------------ measuring a process


@dataclass(frozen=True)
class Measure:
    """A process's wall time and peak resident memory, or why it has none."""

    seconds: float = 0.0
    peak_mb: float = 0.0
    failure: str = ""  # "over 8 GB", "over 120 s", "failed: ..."; empty when it answered
    note: str = ""  # "refused": the reader said, in that time, that the run is too large

    def cell(self) -> str:
        if self.failure:
            return f"**{self.failure}**"
        text = f"{self.seconds:.1f} s, {self.peak_mb:,.0f} MB"
        if self.note:
            text = f"{self.note} in {text}"
        missed = self.seconds > TARGET_SECONDS or self.peak_mb > TARGET_MB
        return f"**{text}**" if missed else text


def measure(
    argv: list[str], *, timeout: float, memory_gb: float, env: dict[str, str] | None = None
) -> tuple[Measure, str]:
    """Run ``argv`` in a process bounded by ``timeout`` and ``memory_gb``; and its stdout."""
    limit = int(memory_gb * 2**30)

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        begin = time.perf_counter()
        process = subprocess.Popen(argv, stdout=out, stderr=err, preexec_fn=bounded, env=env)
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        # wait4, not wait: the usage of this process alone, not the most of all children.
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - begin
        timer.cancel()
        process.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    peak_mb = usage.ru_maxrss / 1024  # KiB on Linux
    if seconds >= timeout and code == -signal.SIGKILL:
        return Measure(failure=f"over {timeout:.0f} s"), stdout
    if code != 0:
        said = stderr.lower()
        if code in (-signal.SIGABRT, -signal.SIGKILL) or any(s in said for s in OUT_OF_MEMORY):
            return Measure(failure=f"over {memory_gb:g} GB"), stdout
        last = (stderr.strip().splitlines() or [f"exit status {code}"])[-1]
        return Measure(failure=f"failed (exit status {code}): {last[:120]}"), stdout
    return Measure(seconds, peak_mb), stdout


def checked(reader: Reader, shape: Shape, found: Measure, stdout: str) -> Measure:
    """``found``, or a failure where the reader's answer is not what the run holds."""
    if found.failure:
        return found
    if not reader.prints_json:
        return found if stdout.strip() else Measure(failure="failed: no output")
    answer = json.loads(stdout.strip().splitlines()[-1])
    if "status" in answer:
        if answer["status"] != 200:
            return Measure(failure=f"failed: status {answer['status']}")
        return Measure(answer["seconds"], found.peak_mb)
    if "refused" in answer:
        return Measure(found.seconds, found.peak_mb, note="refused")
    if reader.rows is not None and answer["rows"] != reader.rows(shape):
        return Measure(failure=f"failed: {answer['rows']:,} rows, not {reader.rows(shape):,}")
    return found


# ------------------------------------------------------------------ the runs


def write_runs(folder: Path, shape: Shape, args: argparse.Namespace) -> Measure | None:
    """Runs ``a`` and ``b`` of ``shape`` in ``folder``; how long ``a`` took, None if reused."""
    if _complete(folder / "a", shape) and _complete(folder / "b", shape):
        return None
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    argv = [sys.executable, str(HERE.parent / "synthetic.py"), str(folder / "a")]
    argv += ["--ranks", str(shape.ranks), "--layers", str(shape.modules)]
    argv += ["--steps", str(shape.steps)]
    # One thread: torch's spinning threads cost more than they give on a shared machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    written, _ = measure(argv, timeout=24 * 3600.0, memory_gb=args.memory_gb, env=env)
    if written.failure:
        raise SystemExit(f"writing the run of {shape.folder}: {written.failure}")
    _link_copy(folder / "a", folder / "b")
    return written


def _complete(run: Path, shape: Shape) -> bool:
    """Whether every rank of ``run`` finished writing ``shape``'s steps."""
    for rank in range(shape.ranks):
        meta = run / (f"rank-{rank:05d}" if rank else "") / "run.json"
        try:
            written = json.loads(meta.read_text())
        except (OSError, ValueError):
            return False
        if written.get("status") != "finished" or written.get("steps") != shape.steps:
            return False
    return True


def _link_copy(source: Path, target: Path) -> None:
    """``target``: the run ``source`` under another name, its data files hard links."""
    for path in sorted(source.rglob("*")):
        copy = target / path.relative_to(source)
        if path.is_dir():
            copy.mkdir(parents=True, exist_ok=True)
        elif path.name == "run.json":
            meta = json.loads(path.read_text())
            copy.write_text(json.dumps({**meta, "name": target.name}, indent=1))
        else:
            os.link(path, copy)


# ------------------------------------------------------------------ the table


def parse_rows(text: str) -> int:
    """``"50M"`` -> 50,000,000; ``"4k"`` -> 4,000; ``"1000"`` -> 1,000."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a count of rows such as 10M, got {text!r}")
    scale = {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def rows_name(rows: int) -> str:
    if rows >= 1_000_000:
        return f"{rows / 1e6:g} M rows"
    return f"{rows:,} rows"


def table(shapes: list[Shape], found: dict[str, dict[Shape, Measure | str]]) -> str:
    """Reader by size: seconds and peak MB; bold where a target is missed."""
    header = "| reader | " + " | ".join(rows_name(shape.rows) for shape in shapes) + " |"
    lines = [header, "|---|" + "---|" * len(shapes)]
    for name, by_shape in found.items():
        cells = [
            value if isinstance(value, str) else value.cell()
            for value in (by_shape[shape] for shape in shapes)
        ]
        lines.append(f"| {READERS[name].label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shapes_of(args: argparse.Namespace) -> list[Shape]:
    if args.steps:
        return [Shape(args.ranks, args.modules, steps) for steps in args.steps]
    per_step = args.ranks * args.modules * KINDS
    return [Shape(args.ranks, args.modules, max(1, round(rows / per_step))) for rows in args.sizes]


def measure_size(
    shape: Shape, args: argparse.Namespace, found: dict[str, dict[Shape, Measure | str]]
) -> Measure | None:
    """Every reader on runs of ``shape``; what writing them took (None: reused)."""
    folder = Path(args.root) / shape.folder
    written = write_runs(folder, shape, args)
    load = os.getloadavg()[0]
    print(f"{rows_name(shape.rows)} ({shape.folder}), load {load:.1f}", file=sys.stderr)
    for name in args.readers:
        reader = READERS[name]
        earlier = [value for value in found[name].values() if isinstance(value, Measure)]
        if any(value.failure.startswith("over") for value in earlier):
            found[name][shape] = "not run"  # over a bound at a smaller size
            continue
        argv = reader.argv(folder)
        result, stdout = measure(argv, timeout=args.timeout, memory_gb=args.memory_gb)
        found[name][shape] = checked(reader, shape, result, stdout)
        print(f"  {name}: {found[name][shape].cell()}", file=sys.stderr)
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return written


def section_text(
    shapes: list[Shape], args: argparse.Namespace, found: dict, written: dict, load: float
) -> str:
    shape = shapes[-1]
    writes = [
        f"{rows_name(size.rows)} in {measure.seconds:.0f} s ({measure.peak_mb:,.0f} MB)"
        for size, measure in written.items()
        if measure is not None
    ]
    return "\n".join(
        [
            f"Runs of a data-parallel job of {shape.ranks} ranks, a model of {shape.modules} "
            f"Linear layers, 4 kinds, every step recorded with log2 histograms: "
            + ", ".join(f"{size.steps:,} steps ({rows_name(size.rows)})" for size in shapes)
            + ". Each rank's files are written by the store's own writer as that rank writes "
            "them (`synthetic.write_ranks`), compacted at close; the second run of `diff` "
            "holds the same files. Each reader in a process of its own, under "
            f"`RLIMIT_AS` of {args.memory_gb:g} GB and a timeout of {args.timeout:.0f} s "
            "(a reader over a bound at one size is not run at the larger ones: not run). "
            "Time: the process's "
            "wall time, start and imports included; for a route, the one request, the first "
            "to a fresh app in the process (`starlette.testclient`); the charts ask for "
            f"`{CHART}`. Peak: the process's peak "
            f"resident memory. Targets: under {TARGET_SECONDS:.0f} s and "
            f"{TARGET_MB / 1024:.0f} GB; bold misses one. Load average before the measures "
            f"(other work on the machine): {load:.1f}."
            + (f" Writing the runs (one thread): {'; '.join(writes)}." if writes else ""),
            "",
            table(shapes, found),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [parse_rows(part) for part in text.split(",")],
        default=[1_000_000, 10_000_000],
        help="rows of each run, comma-separated (1M,10M,50M)",
    )
    parser.add_argument(
        "--steps",
        type=lambda text: [int(part) for part in text.split(",")],
        help="recorded steps of each run, comma-separated, instead of --sizes",
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--modules", type=int, default=250, help="Linear layers of the model")
    parser.add_argument(
        "--readers",
        type=lambda text: text.split(","),
        default=list(READERS),
        help="comma-separated, of: " + ", ".join(READERS),
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per reader")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address space per reader")
    parser.add_argument("--root", default="/tmp/layerscope-scale", help="where the runs go")
    parser.add_argument("--keep", action="store_true", help="keep the runs for a later call")
    parser.add_argument("--quick", action="store_true", help="2 ranks x 10 modules x 25 steps")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.modules, args.steps = 2, 10, [25]
    unknown = set(args.readers) - set(READERS)
    if unknown:
        parser.error(f"--readers: no reader {', '.join(sorted(unknown))}")
    shapes = shapes_of(args)
    load = os.getloadavg()[0]
    found: dict[str, dict[Shape, Measure | str]] = {name: {} for name in args.readers}
    written = {shape: measure_size(shape, args, found) for shape in shapes}
    text = section_text(shapes, args, found, written, load)
    print(text)
    if args.write:
        body = f"Command: `{command('scale.py')}` on {machine(os.cpu_count() or 1)}.\n\n{text}"
        replace_section(SECTION, body)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:])
    else:
        main()
