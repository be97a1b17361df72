"""The dashboard while a run hangs: how fast a healthy run answers while 50 clients wait on one.

    python benchmarks/server_hang.py                             # this checkout's layerscope
    python benchmarks/server_hang.py --before OTHER/src          # and another's, side by side

A folder holds ``healthy`` (the tiny MLP of the UI tests, 6 steps) and two copies whose reading
never ends:

- ``fifo``: its ``run.json`` is a named pipe no one writes (a reader that opens it waits);
- ``stalled``: its files read as a filesystem that stopped answering would, simulated in the
  server's process (opening that run waits forever), whatever the readers do with pipes.

For each, ``layerscope serve`` runs in a process of its own; 50 clients ask for that run at
once and, while they wait, one more asks for the healthy run's summary, the page and the list
of runs, one request at a time. Measured: each request's time (one with no answer in
``--timeout`` seconds counts as none, and after two of those the rest are not asked), what the
50 clients got, and how long the server takes to exit after SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ui"))

from ui_runs import free_port, record

CHECKOUT_SRC = Path(__file__).resolve().parents[1] / "src"
HANGING = ("fifo", "stalled")
# The server of the "stalled" case: opening that run waits forever, then `layerscope serve`.
_STALLED_SERVER = """
import sys, threading
from layerscope.store import Run
opened = Run.__init__
def stalled(self, path, *args, **kwargs):
    if str(path).rstrip("/").endswith("/stalled"):
        threading.Event().wait()
    opened(self, path, *args, **kwargs)
Run.__init__ = stalled
from layerscope.cli import main
sys.exit(main(sys.argv[1:]))
"""

Answer = tuple[float, int | str]


def write_runs(root: Path) -> None:
    """``healthy``, ``fifo`` (its ``run.json`` a pipe no one writes) and ``stalled``."""
    record(root / "healthy", 6)
    for name in HANGING:
        shutil.copytree(root / "healthy", root / name)
    (root / "fifo" / "run.json").unlink()
    os.mkfifo(root / "fifo" / "run.json")


def ask(url: str, timeout: float) -> Answer:
    """(seconds, HTTP status) of a GET, or the seconds and why there was no answer."""
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
            status: int | str = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except TimeoutError:
        status = "no answer"
    except (urllib.error.URLError, ConnectionError) as error:
        status = f"dropped ({type(getattr(error, 'reason', error)).__name__})"
    return time.perf_counter() - start, status


def started_server(root: Path, src: Path, port: int, hanging: str) -> subprocess.Popen[bytes]:
    """``layerscope serve root`` with the layerscope under ``src``, once it answers."""
    command = ["-m", "layerscope"] if hanging == "fifo" else ["-c", _STALLED_SERVER]
    server = subprocess.Popen(
        [sys.executable, *command, "serve", str(root), "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(src)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        if isinstance(ask(f"http://127.0.0.1:{port}/", 1)[1], int):
            return server
        time.sleep(0.1)
    server.kill()
    raise RuntimeError("the server did not answer in 60 s")


def timed(url: str, requests: int, timeout: float) -> list[Answer]:
    """Each of ``requests`` GETs of ``url``, one at a time; stops after 2 with no answer."""
    answers: list[Answer] = []
    for _ in range(requests):
        answers.append(ask(url, timeout))
        if sum(1 for _, status in answers if not isinstance(status, int)) >= 2:
            break
    return answers


def measure(root: Path, src: Path, hanging: str, args: argparse.Namespace) -> dict[str, str]:
    """The figures of one server (the layerscope under ``src``) while ``hanging`` is asked for."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = started_server(root, src, port, hanging)
    figures: dict[str, str] = {}
    try:
        ask(f"{url}/api/runs/healthy", 60)  # opened once: its first read is not measured
        waited: list[Answer] = []
        clients = [
            threading.Thread(
                target=lambda: waited.append(ask(f"{url}/api/runs/{hanging}", 60)), daemon=True
            )
            for _ in range(args.clients)
        ]
        for client in clients:
            client.start()
        time.sleep(1.0)  # every client's request is in
        for name, path in [("healthy run's summary", "/api/runs/healthy"), ("page", "/"),
                           ("list of runs", "/api/runs")]:  # fmt: skip
            figures[name] = describe(timed(url + path, args.requests, args.timeout), args.timeout)
        start = time.perf_counter()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
            figures["exit after SIGTERM"] = f"{time.perf_counter() - start:.2f} s"
        except subprocess.TimeoutExpired:
            figures["exit after SIGTERM"] = "none in 30 s (killed)"
            server.kill()
        for client in clients:
            client.join(timeout=60)
        figures[f"the {args.clients} clients of the hanging run got"] = outcomes(waited)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return figures


def describe(answers: list[Answer], timeout: float) -> str:
    """Median and max of the answered requests' times, and how many had no answer."""
    answered = [seconds for seconds, status in answers if isinstance(status, int)]
    missing = len(answers) - len(answered)
    parts = []
    if answered:
        statuses = sorted({str(status) for _, status in answers if isinstance(status, int)})
        parts.append(
            f"median {statistics.median(answered) * 1e3:.1f} ms, max {max(answered) * 1e3:.1f} ms"
            f" ({len(answered)} answered: {', '.join(statuses)})"
        )
    if missing:
        parts.append(f"{missing} of {len(answers)} with no answer in {timeout:g} s")
    return "; ".join(parts)


def outcomes(answers: list[Answer]) -> str:
    """How many clients got each answer, and after how long the last answer came."""
    counts = Counter(str(status) for _, status in answers)
    answered = [seconds for seconds, status in answers if isinstance(status, int)]
    last = f"; the last after {max(answered):.1f} s" if answered else ""
    return ", ".join(f"{count} x {status}" for status, count in counts.most_common()) + last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout's src, measured first")
    parser.add_argument("--clients", type=int, default=50, help="clients of the hanging run")
    parser.add_argument("--requests", type=int, default=20, help="requests of each healthy URL")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds a request may take")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    sources = {"before": args.before} if args.before is not None else {}
    sources["after" if args.before is not None else "this checkout"] = CHECKOUT_SRC
    columns: dict[str, dict[str, str]] = {name: {} for name in sources}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "runs"
        write_runs(root)
        for hanging in HANGING:
            for name, src in sources.items():
                figures = measure(root, src, hanging, args)
                columns[name].update(
                    {f"{hanging}: {what}": value for what, value in figures.items()}
                )
    print(f"{args.clients} clients wait on a hanging run; meanwhile {args.requests} requests of "
          "each healthy URL, one at a time")  # fmt: skip
    print()
    print("| while 50 clients wait on | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in next(iter(columns.values())):
        print(f"| {row} | " + " | ".join(column[row] for column in columns.values()) + " |")


if __name__ == "__main__":
    main()
