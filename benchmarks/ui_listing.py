"""The dashboard's list of runs: how fast ``/api/runs`` answers over a folder of many runs.

    python benchmarks/ui_listing.py              # 20 runs, prints the figures
    python benchmarks/ui_listing.py --runs 50    # more runs

Small real runs (the tiny MLP of the UI tests, every fourth with a NaN, hence an alert) are
written under a temporary folder; the page asks for ``/api/runs`` every 2 s while it shows the
list, so every open page repeats it. Measured:

- first answer: the first request of a fresh app, through starlette's TestClient;
- repeated: the median (p50) and 90th percentile of the next requests, one at a time, through
  the TestClient;
- concurrent: the real app under uvicorn on 127.0.0.1, 50 clients asking at once, each a few
  times; the median and 90th percentile of their answers' times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ui"))

from ui_runs import Server, record


def write_runs(root: Path, count: int, steps: int) -> None:
    for index in range(count):
        record(root / f"run{index:03d}", steps, nan_at=2 if index % 4 == 0 else None, seed=index)


def percentile(times: list[float], fraction: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def through_test_client(root: Path, repeats: int) -> tuple[float, list[float]]:
    """Seconds of the first request of a fresh app, and of each of ``repeats`` more."""
    from starlette.testclient import TestClient

    from layerscope.ui._app import create_app

    with TestClient(create_app(root), base_url="http://127.0.0.1") as client:
        start = time.perf_counter()
        assert client.get("/api/runs").status_code == 200
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            assert client.get("/api/runs").status_code == 200
            times.append(time.perf_counter() - start)
    return first, times


def concurrent(root: Path, clients: int, each: int, path: str = "/api/runs") -> list[float]:
    """Seconds of each answer, ``clients`` asking at once ``each`` times, over HTTP."""

    def ask(url: str) -> list[float]:
        times = []
        for _ in range(each):
            start = time.perf_counter()
            with urllib.request.urlopen(url + path, timeout=120) as response:
                response.read()
            times.append(time.perf_counter() - start)
        return times

    with Server(root) as server, ThreadPoolExecutor(clients) as pool:
        urllib.request.urlopen(server.url + "/api/runs", timeout=120).read()  # opened once
        return [t for times in pool.map(ask, [server.url] * clients) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--each", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the NaN alerts warn as they are recorded
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        write_runs(root, args.runs, args.steps)
        first, repeated = through_test_client(root, args.repeats)
        together = concurrent(root, args.clients, args.each)
        floor = concurrent(root, args.clients, args.each, "/static/base.js")
    ms = 1e3
    print(f"{args.runs} runs of {args.steps} steps; /api/runs")
    print(f"| first answer of a fresh app (TestClient) | {first * ms:.1f} ms |")
    print(
        f"| repeated, one at a time (TestClient): p50, p90 of {len(repeated)} "
        f"| {statistics.median(repeated) * ms:.2f} ms, {percentile(repeated, 0.9) * ms:.2f} ms |"
    )
    print(
        f"| {args.clients} clients at once (uvicorn): p50, p90 of {len(together)} "
        f"| {statistics.median(together) * ms:.1f} ms, {percentile(together, 0.9) * ms:.1f} ms |"
    )
    print(
        f"| the same, /static/base.js (no run read: the server's own floor) "
        f"| {statistics.median(floor) * ms:.1f} ms, {percentile(floor, 0.9) * ms:.1f} ms |"
    )


if __name__ == "__main__":
    main()
